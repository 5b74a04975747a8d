"""deepspeed.utils.logging: DeepSpeed's logger (transformers and Lightning set its level)."""
import logging

logger = logging.getLogger("DeepSpeed")
if not logger.handlers:
    _h = logging.StreamHandler()
    _h.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"))
    logger.addHandler(_h)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def log_dist(message, ranks=None, level=logging.INFO):
    """Logs on the listed ranks (all with -1; rank 0 when None)."""
    from zeroshard import comm
    rank = comm.get_rank()
    ranks = [0] if ranks is None else ranks
    if -1 in ranks or rank in ranks:
        logger.log(level, f"[Rank {rank}] {message}")
