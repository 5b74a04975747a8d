"""_exit.py - how engines end: one engine's collective end (zs_finalize), the end of every live engine and
of MPI at exit, and the exit of a rank that meets an uncaught exception (so the other ranks are stopped by
the launcher rather than left waiting in a collective)."""
import atexit
import os
import sys
import weakref

from . import _lib as L

_engines = weakref.WeakSet()   # the live engines (zeroshard.comm, zero and utils find theirs here)


def _finalize(lib, ctx, hooks, params, empty, mem=None):
    """The engine's end, as weakref.finalize runs it: holds no reference to the engine itself."""
    if not ctx:
        return
    for h in hooks:
        h.remove()
    hooks.clear()
    for p in params:   # the views would dangle once the library frees its buffers
        p.data = empty
    L.check(lib.zs_finalize(ctx), "zs_finalize")
    ctx.value = None
    if hasattr(mem, "close"):   # the emulated stand-in for torch's stream, the program's to destroy
        mem.close()


def _install_excepthook():
    """An uncaught exception on one rank would leave the others waiting in their next collective, and this
    rank in the collective end at exit, until zeroshard.timeout_s. With an engine alive, such an exception
    prints its traceback and the process exits 1 at once, skipping that end, so the launcher (mpirun, srun
    --kill-on-bad-exit) stops the job within a second. The hook present (Python's, torch.distributed's, the
    script's) still prints first; ZEROSHARD_EXCEPTHOOK=0 leaves it alone."""
    prev = sys.excepthook
    if getattr(prev, "_zeroshard", False) or os.environ.get("ZEROSHARD_EXCEPTHOOK", "1") == "0":
        return

    def hook(kind, value, tb):
        prev(kind, value, tb)
        live = [e for e in list(_engines) if e.ctx]
        if not live:
            return
        print(f"zeroshard: rank {live[0].global_rank}: uncaught {kind.__name__}: exiting without the collective "
              "end so the launcher stops the other ranks", file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        from . import _elastic
        _elastic.rank_exit(f"uncaught {kind.__name__}")
        os._exit(1)

    hook._zeroshard = True
    sys.excepthook = hook


@atexit.register
def _finalize_all():
    for e in list(_engines):
        try:
            e.destroy()
        except Exception:   # exiting anyway; MPI may already be gone
            pass
    L.finalize_mpi()
