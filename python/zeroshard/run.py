"""zeroshard-run (python -m zeroshard.run): starts a training script on ZeroShard, unchanged.

    zeroshard-run -np 2 train.py --deepspeed ds.json        # was: deepspeed --num_gpus 2 train.py --deepspeed ds.json
    zeroshard-run -np 2 --use_deepspeed --deepspeed_config_file ds.json train.py
                                                            # was: accelerate launch --use_deepspeed ... train.py

Outside MPI it runs itself under `mpirun` (-np, --hostfile, -H and any other option before the script go to
mpirun). Inside an MPI job (this launcher's, the user's own `mpirun`, or `srun`) each rank exports what scripts
written for torchrun and DeepSpeed's launcher read (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, LOCAL_SIZE,
MASTER_ADDR, MASTER_PORT), puts ZeroShard's DeepSpeed-compatible package (zeroshard/compat/deepspeed) first on
the import path, so that `import deepspeed` in the script and in every library it imports is ZeroShard, and
runs the script as __main__ (a program that is not a Python script is exec'd). A real DeepSpeed installed
beside it is untouched outside this launcher. With --max-restarts K it starts the job again, up to K times, on
the ranks that remain when ranks or hosts die, and takes SIGTERM as a preemption (zeroshard/_elastic.py).
"""
import importlib.abc
import importlib.metadata
import os
import pathlib
import shlex
import shutil
import sys

from . import _elastic
from ._mpienv import mpi_rank_env

DEEPSPEED_VERSION = "0.19.8+zeroshard"   # the DeepSpeed release whose API zeroshard/compat follows
COMPAT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compat")
# mpirun options that take a value (two for --mca): the launcher passes them through with it
_MPIRUN_VALUE = {"-x", "--map-by", "-map-by", "--bind-to", "-bind-to", "--rank-by", "-rank-by", "--npernode",
                 "-npernode", "-N", "--prefix", "--wdir", "-wdir", "--tmpdir", "--output-filename",
                 "--report-bindings-file", "--app", "-am", "--tune"}
_MPIRUN_TWO = {"--mca", "-mca", "--gmca", "-gmca"}
# accelerate launch's DeepSpeed flags: the environment `accelerate launch` gives its processes
_ACCELERATE = {"--deepspeed_config_file": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
               "--zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
               "--gradient_accumulation_steps": "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
               "--gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
               "--offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
               "--offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
               "--zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
               "--zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
               "--mixed_precision": "ACCELERATE_MIXED_PRECISION"}
USAGE = """usage: zeroshard-run [-np N] [--hostfile FILE | -H HOSTS] [--use_deepspeed [--deepspeed_config_file F ...]]
                     [--max-restarts K [--min-ranks M]] [--run-dir DIR]
                     [mpirun options] (SCRIPT | -m MODULE | PROGRAM) [ARGS...]"""

def _split(argv):
    """(mpirun options, launcher options, script argv)."""
    mpi, own, i = [], {"np": None, "env": {}, "max_restarts": 0, "min_ranks": 1, "run_dir": None}, 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(USAGE + "\n\n" + __doc__)
            sys.exit(0)
        if a == "--":
            i += 1
            break
        if not a.startswith("-"):
            break
        if a == "-m":
            break
        key, eq, val = a.partition("=")
        if key in ("-np", "-n", "--np", "--num_processes", "--nproc_per_node", "--num_gpus"):
            own["np"] = int(val if eq else argv[i + 1])
            i += 1 if eq else 2
        elif key in ("--max-restarts", "--max_restarts", "--min-ranks", "--min_ranks", "--run-dir", "--run_dir"):
            v = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            name = key.lstrip("-").replace("-", "_")
            if name == "run_dir":
                own[name] = v
            elif v.isdigit():
                own[name] = int(v)
            else:
                sys.exit(f"zeroshard-run: {key} takes a whole number, not '{v}'")
            i += 1 if eq else 2
        elif key in ("--no_local_rank",):   # the DeepSpeed launcher's: LOCAL_RANK is exported,
            i += 1                                        # --local_rank is never appended
        elif key in ("--master_port", "--master_addr"):
            own["env"]["MASTER_" + key[len("--master_"):].upper()] = val if eq else argv[i + 1]
            i += 1 if eq else 2
        elif key == "--use_deepspeed":
            own["env"].setdefault("ACCELERATE_USE_DEEPSPEED", "true")
            i += 1
        elif key in _ACCELERATE:
            own["env"][_ACCELERATE[key]] = val if eq else argv[i + 1]
            own["env"]["ACCELERATE_USE_DEEPSPEED"] = "true"
            i += 1 if eq else 2
        elif key in ("--hostfile", "-hostfile", "--host", "-H") and not eq:
            mpi += [a, argv[i + 1]]
            i += 2
        elif key in _MPIRUN_TWO and not eq:
            mpi += argv[i:i + 3]
            i += 3
        elif key in _MPIRUN_VALUE and not eq:
            mpi += argv[i:i + 2]
            i += 2
        else:
            mpi.append(a)
            i += 1
    script = argv[i:]
    if not script or script == ["-m"]:
        sys.exit(USAGE + "\nzeroshard-run: no script to run")
    return mpi, own, script


def _spawn(mpi, own, script):
    """Runs this launcher under mpirun, one process per rank, under the restart policy (zeroshard._elastic);
    returns the job's exit status."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("zeroshard-run: mpirun not found (Debian: apt-get install openmpi-bin); or start the job with "
                 "your own mpirun/srun and `python -m zeroshard.run SCRIPT`")
    env = dict(os.environ)
    n = own["np"] if own["np"] is not None else 1
    if own["min_ranks"] > n:
        sys.exit(f"zeroshard-run: --min-ranks {own['min_ranks']} is more than the {n} rank(s) asked for")
    if os.geteuid() == 0:   # containers run as root; Open MPI refuses that unless told
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    remote = any(a in ("--hostfile", "-hostfile", "--host", "-H") for a in mpi)
    env.update(own["env"])
    # Open MPI forwards only the variables named with -x to remote hosts (locally it forwards all)
    forward = sorted(own["env"]) + ["PYTHONPATH", "ZEROSHARD_LIB", _elastic.ATTEMPT_ENV, "ZEROSHARD_RESTART_COUNT",
                                    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"]

    def command(world, mpi_now):
        cmd = [mpirun, "-np", str(world)]
        if not remote and world > (os.cpu_count() or 1) and "--oversubscribe" not in mpi_now:
            cmd.append("--oversubscribe")   # more ranks than cores on one machine (a test, a laptop)
        for k in forward:
            if k in env or k.startswith(("ZEROSHARD_", "TORCHELASTIC_")):
                cmd += ["-x", k]
        cmd += mpi_now + [sys.executable, "-m", "zeroshard.run", "--"] + script
        if os.environ.get("ZEROSHARD_RUN_VERBOSE"):
            print("zeroshard-run: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
        return cmd
    sup = _elastic.Supervisor(command, env, n, mpi, own["max_restarts"], own["min_ranks"], own["run_dir"])
    return sup.run()


def _rendezvous(rank):
    """MASTER_ADDR and MASTER_PORT agreed by every rank: rank 0's address and a free port of its host (the
    user's values when set), sent over MPI. Collective over MPI_COMM_WORLD."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    from . import _lib, comm
    _lib.init_mpi()
    addr, _, port = comm._rendezvous(rank, None).rpartition(":")
    return addr, port


def export_world(rendezvous=True):
    """In an MPI rank: the torchrun/DeepSpeed variables, set from MPI (they override stale values: MPI's
    world is the one that trains). Returns (rank, world). Without rendezvous (a program about to be exec'd,
    which starts MPI itself) MASTER_ADDR/MASTER_PORT are left as they are."""
    info = mpi_rank_env()
    if info is None:
        return None
    rank, world, local, lsize = info
    env = os.environ
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(lsize),
               LOCAL_SIZE=str(lsize))
    if rendezvous:
        env["MASTER_ADDR"], env["MASTER_PORT"] = _rendezvous(rank)
    env["ZEROSHARD_RUN"] = "1"
    return rank, world


class _CompatDistribution(importlib.metadata.Distribution):
    """The `deepspeed` distribution's metadata, for the version checks of transformers, Accelerate and Lightning
    (`importlib.metadata`). Served by a finder rather than a .dist-info folder, which wheels may not carry
    inside a package."""

    def read_text(self, filename):
        return {"METADATA": f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {DEEPSPEED_VERSION}\n"
                            "Summary: ZeroShard's DeepSpeed-compatible package (zeroshard-run only)\n",
                "INSTALLER": "zeroshard\n", "top_level.txt": "deepspeed\n"}.get(filename)

    def locate_file(self, path):
        return pathlib.Path(COMPAT) / path


class _CompatFinder(importlib.abc.MetaPathFinder):
    """Finds no modules (the path does); answers `importlib.metadata` for "deepspeed" before any installed one."""

    def find_spec(self, fullname, path, target=None):
        return None

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        name = context.name
        if name is None or name.lower().replace("_", "-") == "deepspeed":
            yield _CompatDistribution()


def use_compat():
    """`import deepspeed` resolves to ZeroShard's package, here and in processes this one starts (DataLoader
    workers, subprocesses), and its distribution metadata is what `importlib.metadata` finds first."""
    if not any(isinstance(f, _CompatFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CompatFinder())
    if sys.path[:1] != [COMPAT]:
        sys.path.insert(0, COMPAT)
    pp = os.environ.get("PYTHONPATH", "")
    if pp.split(os.pathsep)[:1] != [COMPAT]:
        os.environ["PYTHONPATH"] = COMPAT + (os.pathsep + pp if pp else "")
    old = sys.modules.get("deepspeed")
    if old is not None and not getattr(old, "__zeroshard__", False):
        sys.exit("zeroshard-run: the real deepspeed was imported before the launcher could replace it")


def _run(script):
    import runpy
    if script[0] == "-m":
        if len(script) < 2:
            sys.exit(USAGE)
        sys.argv = [script[1]] + script[2:]
        sys.path.insert(1, os.getcwd())
        runpy.run_module(script[1], run_name="__main__", alter_sys=True)
        return
    path = script[0]
    if not os.path.exists(path):
        sys.exit(f"zeroshard-run: script '{path}' not found")
    sys.argv = list(script)
    sys.path.insert(1, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")


def _program(script):
    """The path of a program (not a Python script) to exec in each rank, or None."""
    path = script[0]
    if script[0] == "-m" or path.endswith(".py") or not os.path.isfile(path) or not os.access(path, os.X_OK):
        return None
    with open(path, "rb") as f:
        head = f.read(64)
    return None if head.startswith(b"#!") and b"python" in head.split(b"\n")[0] else path


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    mpi, own, script = _split(argv)
    if mpi_rank_env() is None:
        sys.exit(_spawn(mpi, own, script))
    if mpi:
        sys.exit(f"zeroshard-run: inside an MPI job the mpirun options {mpi} have no effect; give them to your "
                 "mpirun")
    os.environ.update(own["env"])
    prog = _program(script)
    rank, world = export_world(rendezvous=prog is None)
    _elastic.rank_started(rank, world, execs=prog is not None)
    if prog is not None:   # a C program (the examples): MPI and SIGTERM are its own; the variables stay set
        os.execv(prog, script)
    use_compat()
    from . import _accelerate_cpu   # acts only where Accelerate takes its DeepSpeed path without a GPU
    _accelerate_cpu.install()
    _run(script)


if __name__ == "__main__":
    main()
