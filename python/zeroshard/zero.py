"""zeroshard.zero: deepspeed.zero's GatheredParameters for reading full parameters at stage 3."""


class GatheredParameters:
    """with GatheredParameters(module.parameters()): the full parameters are readable inside the block
    (their units fetched), and released again on exit. Writing them back (modifier_rank) is not supported:
    at stage 3 only the owning rank's shard is the truth, and it lives in ZeroShard's fp32 masters."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if modifier_rank is not None:
            raise NotImplementedError("zeroshard.zero.GatheredParameters: modifier_rank is not supported "
                                      "(parameters are read-only here; set initial values before initialize)")
        from .engine import _engines
        if not isinstance(params, (list, tuple)):
            params = [params] if hasattr(params, "data_ptr") else list(params)
        self._units = []
        self._engine = None
        if not enabled:
            return
        for e in list(_engines):
            us = {e._pinfo[p] for p in params if p in e._pinfo}
            if us:
                self._engine = e
                self._units = sorted(us, key=lambda u: u.idx)
                break

    def __enter__(self):
        for u in self._units:
            self._engine._acquire(u)
        return self

    def __exit__(self, *exc):
        for u in reversed(self._units):
            self._engine._release(u)
        return False
