"""How a module maps onto ZeroShard's units (the blocks of repeated ModuleLists, the rest, frozen parameters
apart), and the config as the front end reads it before handing it to the library."""
import json
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
    """The config as a dict, from a path or a dict (a copy: initialize adds the client optimizer's section)."""
    if isinstance(config, (str, os.PathLike)):
        with open(config) as f:
            return json.load(f)
    if isinstance(config, dict):
        return json.loads(json.dumps(config))
    raise TypeError("zeroshard.initialize: config must be a path or a dict, got " + type(config).__name__)


def _check_device(cfg):
    dev = cfg.get("zeroshard", {}).get("device") if isinstance(cfg.get("zeroshard"), dict) else None
    if dev not in (None, "cpu"):
        raise ValueError(f"zeroshard.initialize: zeroshard.device \"{dev}\": the PyTorch front end trains on the "
                         "CPU only (its parameters are views of ZeroShard's host buffers); remove the key or set "
                         "\"cpu\"")
