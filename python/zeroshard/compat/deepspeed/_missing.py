"""What a script reaches that ZeroShard does not implement: raised naming the DeepSpeed name. The error is a
NotImplementedError and an AttributeError, so `hasattr(deepspeed.x, "y")` stays False as code expects."""
import importlib.abc
import sys

DOC = "docs/deepspeed_api.md lists what is covered"


class NotProvided(NotImplementedError, AttributeError):
    pass


def missing(name):
    return NotProvided(f"{name} is not implemented by ZeroShard's DeepSpeed-compatible package ({DOC})")


def module_getattr(modname):
    """A module __getattr__ refusing every name the module does not define."""
    def __getattr__(name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise missing(f"{modname}.{name}")
    return __getattr__


def refuse(name):
    """A callable that raises naming `name` (for DeepSpeed functions a client may call)."""
    def call(*args, **kwargs):
        raise missing(name)
    call.__name__ = name.rsplit(".", 1)[-1]
    return call


class _Finder(importlib.abc.MetaPathFinder):
    """A deepspeed.* module this package lacks: ModuleNotFoundError naming it, rather than Python's bare
    "No module named"; asked last, so every module that exists is found first."""

    def find_spec(self, name, path, target=None):
        if name.startswith("deepspeed.") and sys.modules.get("deepspeed") is not None:
            raise ModuleNotFoundError(f"{name} is not implemented by ZeroShard's DeepSpeed-compatible package "
                                      f"({DOC})", name=name)
        return None


def install_finder():
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
