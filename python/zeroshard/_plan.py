"""How a module maps onto ZeroShard's units (the blocks of repeated ModuleLists, the rest, frozen parameters
apart), and the config as the front end reads it before handing it to the library."""
import base64
import json
import math
import os


class _Ref:
    """A saved tensor that lives in a unit's buffer: rebuilt from the unit when backward needs it."""
    __slots__ = ("unit", "size", "stride", "offset")

    def __init__(self, unit, size, stride, offset):
        self.unit, self.size, self.stride, self.offset = unit, size, stride, offset


class _Unit:
    def __init__(self, idx, name):
        self.idx, self.name = idx, name
        self.params = []        # (param, offset, numel, shape)
        self.numel = 0
        self.nreq = 0           # parameters that take a gradient
        self.refs = 0           # forward fetches outstanding (nested modules, tied parameters)
        self.ptr = None         # the fetched buffer's address while fetched (stage 3) / for good (0-2)
        self.flat = None
        self.pending = []       # (parameter, gradient) of this micro-batch, until the unit's last one
        self.ngot = 0
        self.handed = False
        self.gptr = None        # the gradient buffer's address, its view, and the parameters' views of it
        self.gflat = None
        self.gviews = []
        self.bw_held = False    # fetched by backward (a saved tensor or a recomputed forward needed it)
        self.frozen = False     # requires_grad=False (or left out of the optimizer): no gradient, no update


def _unit_plan(module, nn, trainable):
    """[(unit name, [parameter], frozen), ...] in registration order, the parameters' names and the block
    modules. A block with both trainable and frozen parameters is two units, "<block>" and "<block>.frozen"
    (the library keeps a unit all one or the other); an all-frozen block is one frozen unit."""
    blocks = []

    def visit(prefix, m):
        if isinstance(m, (nn.ModuleList, nn.Sequential)):
            kids = [(n, c) for n, c in m.named_children() if next(c.parameters(), None) is not None]
            if len(kids) >= 2 and len({type(c) for _, c in kids}) == 1:
                blocks.extend((prefix + n, c) for n, c in kids)
                return
        for n, c in m.named_children():
            visit(prefix + n + ".", c)

    visit("", module)
    owner = {}
    for i, (_, b) in enumerate(blocks):
        for p in b.parameters():
            owner.setdefault(id(p), i + 1)
    parts = [("rest", [], [])] + [(n, [], []) for n, _ in blocks]
    names = {}
    for name, p in module.named_parameters():   # each parameter once (tied ones under their first name)
        names[id(p)] = name
        part = parts[owner.get(id(p), 0)]
        (part[1] if id(p) in trainable else part[2]).append(p)
    units = []
    for name, live, frozen in parts:
        if live:
            units.append((name, live, False))
        if frozen:
            units.append((name + ".frozen" if live else name, frozen, True))
    return units, names, [b for _, b in blocks]


def _stage_of(cfg):
    z = cfg.get("zero_optimization", 0)
    if z is True:
        return 1
    if isinstance(z, dict):
        return int(z.get("stage", 0))
    return 0



def load_config(config):
    """The config as a dict (a copy: initialize adds the client optimizer's section), from a dict, a path, JSON
    text, or base64-encoded JSON (what DeepSpeed takes besides a path). Accelerate writes steps_per_print as
    infinity for "never": that is 0 here; any other value that is not a finite number is refused by its key."""
    if isinstance(config, dict):
        cfg = json.loads(json.dumps(config, allow_nan=True))
    elif isinstance(config, (str, os.PathLike)):
        text = os.fspath(config)
        if os.path.exists(text):
            with open(text) as f:
                cfg = json.load(f)
        elif text.lstrip().startswith("{"):
            cfg = json.loads(text)
        else:
            try:
                cfg = json.loads(base64.urlsafe_b64decode(text).decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                raise FileNotFoundError(f"zeroshard.initialize: config '{text}' is not a file, JSON text or base64 "
                                        "JSON") from None
    else:
        raise TypeError("zeroshard.initialize: config must be a path, JSON text or a dict, got " + type(config).__name__)
    if not isinstance(cfg, dict):
        raise ValueError(f"zeroshard.initialize: the config is a JSON {type(cfg).__name__}, not an object")
    spp = cfg.get("steps_per_print")
    if isinstance(spp, float) and math.isinf(spp) and spp > 0:
        cfg["steps_per_print"] = 0
    _finite(cfg, "")
    return cfg


def initialize_config(args, config, config_params):
    """initialize's config as a dict: `config`, else `config_params`, else `args.deepspeed_config` (DeepSpeed's
    order); None when none is given."""
    if config is None:
        config = config_params if config_params is not None else getattr(args, "deepspeed_config", None)
    return None if config is None else load_config(config)


def _finite(node, path):
    if isinstance(node, dict):
        for k, v in node.items():
            _finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _finite(v, f"{path}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        raise ValueError(f"zeroshard.initialize: config key '{path}' is {node}, not a finite number")


def _device_of(cfg, model):
    """"cpu" or "cuda": zeroshard.device where the config names it (the library checks the value, naming the key),
    else "cuda" for a model with a parameter on a GPU, as DeepSpeed takes the model's device; then the returned
    config (a copy) names it. Returns (device, config)."""
    zs = cfg.get("zeroshard")
    dev = zs.get("device") if isinstance(zs, dict) else None
    if dev is not None:
        return dev, cfg
    if not any(p.device.type == "cuda" for p in model.parameters()):
        return "cpu", cfg
    cfg = dict(cfg)
    cfg["zeroshard"] = dict(zs or {}, device="cuda")
    return "cuda", cfg
