"""overlap.torch.parallelize: an existing model's nn.Linear modules replaced,
in place, by tensor-parallel layers holding this rank's block of their
current weights; and transformer_plan, the usual plan of transformer
blocks."""

import fnmatch

import torch
from torch import nn

from .layers import ColumnParallelLinear, RowParallelLinear, even_split

STYLES = {"column": ColumnParallelLinear, "row": RowParallelLinear}
_SPEC_KEYS = {"style", "activation", "strategy", "unit", "parts"}


def _spec(pattern, value):
    """A plan entry as a dict: "column" / "row", or a dict with ``style`` and
    any of activation, strategy, unit, parts."""
    spec = {"style": value} if isinstance(value, str) else dict(value) if isinstance(value, dict) else None
    if spec is None or spec.get("style") not in STYLES:
        raise ValueError(f"parallelize: plan[{pattern!r}] must be 'column', 'row' or a dict with style 'column' or "
                         f"'row' (got {value!r})")
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise ValueError(f"parallelize: plan[{pattern!r}] has unknown keys {sorted(unknown)} "
                         f"(known: {sorted(_SPEC_KEYS)})")
    if spec.get("parts", 1) != 1 and spec["style"] != "column":
        raise ValueError(f"parallelize: plan[{pattern!r}]: parts is for column layers (a fused QKV projection)")
    for key in ("unit", "parts"):
        if not isinstance(spec.get(key, 1), int) or spec.get(key, 1) < 1:
            raise ValueError(f"parallelize: plan[{pattern!r}][{key!r}] must be a positive integer")
    return spec


def _tied(model):
    """id of every parameter held by more than one module (tied weights)."""
    seen, tied = set(), set()
    for m in model.modules():
        for p in m._parameters.values():
            if p is None:
                continue
            (tied if id(p) in seen else seen).add(id(p))
    return tied


def _targets(model, plan):
    """[(name, nn.Linear, spec)] in the model's module order; ValueError for
    a pattern that names no module, a module that is not nn.Linear, one named
    twice with different specs, or one whose parameters are tied."""
    if not isinstance(plan, dict) or not plan:
        raise ValueError("parallelize: plan must be a non-empty dict of module names (or patterns) to styles")
    modules = dict(model.named_modules())
    chosen = {}
    for pattern, value in plan.items():
        spec = _spec(pattern, value)
        names = [n for n in modules if n and fnmatch.fnmatchcase(n, pattern)]
        if not names:
            raise ValueError(f"parallelize: plan entry {pattern!r} names no module of the model")
        for n in names:
            if not isinstance(modules[n], nn.Linear):
                raise ValueError(f"parallelize: {n!r} is a {type(modules[n]).__name__}, not an nn.Linear")
            if n in chosen and chosen[n] != spec:
                raise ValueError(f"parallelize: {n!r} is named by two plan entries with different styles")
            chosen[n] = spec
    for n, spec in chosen.items():
        lin = modules[n]
        if spec["style"] == "column":
            _split_sizes(lin.out_features, spec.get("unit", 1), spec.get("parts", 1), 1, repr(n))
        else:
            _split_sizes(lin.in_features, spec.get("unit", 1), 1, 1, repr(n))
    tied = _tied(model)
    for n in chosen:
        if any(id(p) in tied for p in modules[n].parameters()):
            raise ValueError(f"parallelize: {n!r} shares a parameter with another module (tied weights); "
                             "a parallelized layer holds only its block of it")
    return [(n, modules[n], chosen[n]) for n in modules if n in chosen]


def _fingerprint(t):
    """Sum and absolute sum in float64: equal (to rounding) on ranks holding equal values."""
    d = t.detach().double()
    return float(d.sum()), float(d.abs().sum())


def _agree(ctx, targets):
    """Every rank must replace the same modules, alike, holding the same
    weights: ValueError on every rank naming the first difference."""
    mine = []
    for n, lin, spec in targets:
        fp = [_fingerprint(p) for p in (lin.weight, lin.bias) if p is not None]
        mine.append((n, sorted(spec.items(), key=str), tuple(lin.weight.shape), str(lin.weight.dtype), fp))
    every = ctx.comm.allgather(mine)
    for r, theirs in enumerate(every):
        what = _difference(every[0], theirs)
        if what:
            raise ValueError(f"parallelize: rank {r} differs from rank 0: {what} (every rank must build the same "
                             "model with the same weights, e.g. from the same seed or checkpoint, and the same plan)")


def _difference(a, b):
    if [t[:4] for t in a] != [t[:4] for t in b]:
        return "the modules it replaces, their plan or their shapes"
    for (n, *_, fa), (_, *_, fb) in zip(a, b):
        for (sa, aa), (sb, _) in zip(fa, fb):
            if abs(sa - sb) > 1e-9 * max(aa, 1e-300):
                return f"the weights of {n!r}"
    return None


def _block(t, dim, sizes, rank, parts):
    """This rank's block of t along dim: of each of ``parts`` equal parts, its
    share (``sizes``) of the part's rows, the parts' blocks concatenated."""
    lo = sum(sizes[:rank])
    chunks = t.chunk(parts, dim) if parts > 1 else (t,)
    return torch.cat([c.narrow(dim, lo, sizes[rank]) for c in chunks], dim).clone()


def _split_sizes(n, unit, parts, ranks, what):
    if n % (unit * parts):
        raise ValueError(f"parallelize: {what} has {n} features, not a multiple of unit {unit} x parts {parts}")
    return [s * unit for s in even_split(n // parts // unit, ranks)]


def _parallel(ctx, name, lin, spec, sequence_parallel, strategy):
    """The parallel layer of ``lin``, holding this rank's block of its weights."""
    unit, parts = spec.get("unit", 1), spec.get("parts", 1)
    kw = dict(bias=lin.bias is not None, strategy=spec.get("strategy", strategy), dtype=lin.weight.dtype,
              sequence_parallel=sequence_parallel, activation=spec.get("activation"), _init=False)
    r, R = ctx.rank, ctx.size
    with torch.no_grad():
        if spec["style"] == "column":
            sizes = _split_sizes(lin.out_features, unit, parts, R, repr(name))
            layer = ColumnParallelLinear(ctx, lin.in_features, parts * sizes[r], **kw)
            layer.weight.copy_(_block(lin.weight, 0, sizes, r, parts))
            if lin.bias is not None:
                layer.bias.copy_(_block(lin.bias, 0, sizes, r, parts))
        else:
            sizes = _split_sizes(lin.in_features, unit, 1, R, repr(name))
            layer = RowParallelLinear(ctx, sizes[r], lin.out_features, **kw)
            layer.weight.copy_(_block(lin.weight, 1, sizes, r, 1))
            if lin.bias is not None:
                layer.bias.copy_(lin.bias)
    layer.unit, layer.parts = unit, parts
    for p_new, p_old in zip(layer.parameters(), lin.parameters()):
        p_new.requires_grad_(p_old.requires_grad)
    return layer


def _replace(model, name, layer):
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    parent._modules[child] = layer


def parallelize(model, ctx, plan, sequence_parallel=True, strategy="automatic"):
    """Replaces, in place, the nn.Linear modules of ``model`` that ``plan``
    names by tensor-parallel layers over the ranks of ``ctx``, each holding
    this rank's block of the module's current weight and bias. Returns the
    model. Collective over ctx: every rank passes the same model (the same
    modules, shapes and weights: built from one seed or loaded from one
    checkpoint) and the same plan; a difference raises ValueError on every
    rank, before any module is replaced.

    plan: {name or fnmatch pattern (as model.named_modules() names the
    modules, e.g. "blocks.*.mlp.up"): style}. A style is "column" (output
    features split: ColumnParallelLinear), "row" (input features split:
    RowParallelLinear) or a dict with "style" and any of:

    - "activation": None, "relu" or "gelu", fused into the op (remove the
      model's own call to it);
    - "strategy": this layer's strategy (default: ``strategy``);
    - "unit": features split in whole units (attention's head size, so that
      no head is cut);
    - "parts": a column layer's output is this many equal parts (a fused QKV
      projection: 3), each split over the ranks, this rank's blocks of the
      parts concatenated.

    The replaced layers keep nn.Linear's parameter names (weight, bias) with
    this rank's shapes, and their ``in_features``/``out_features`` are this
    rank's: code that derives attention's head count from a projection's
    width keeps working. Build the optimizer after this call.

    With ``sequence_parallel`` (default) the model's input is this rank's
    rows (its part of the first dimension, sequence_slice) and so is its
    output; every parameter not split (layer norms, embeddings, the row
    layers' biases) is marked ``sequence_parallel`` for
    allreduce_replicated_grads. Without it every rank holds every row.
    """
    targets = _targets(model, plan)
    _agree(ctx, targets)
    split = set()
    for name, lin, spec in targets:
        layer = _parallel(ctx, name, lin, spec, sequence_parallel, strategy)
        _replace(model, name, layer)
        split.update(id(getattr(layer, n)) for n, _ in layer.sharded())
    if sequence_parallel:
        for p in model.parameters():
            if id(p) not in split:
                p.sequence_parallel = True
    return model


def transformer_plan(blocks, head_dim, q=None, k=None, v=None, qkv=None, out=None, up=None, down=None,
                     activation=None):
    """The plan of transformer blocks (Megatron's): attention's q, k and v
    (or one fused ``qkv``) column-parallel and its ``out`` row-parallel, all
    split in whole heads of ``head_dim`` features; the MLP's ``up``
    column-parallel (with ``activation`` fused, if given) and its ``down``
    row-parallel. ``blocks`` is the pattern of the blocks' names
    ("blocks.*"); the other names are relative to a block, and those left
    None are not in the plan.

        plan = transformer_plan("blocks.*", head_dim=64, q="attn.q", k="attn.k",
                                v="attn.v", out="attn.out", up="mlp.fc1", down="mlp.fc2")
    """
    plan = {}

    def put(name, spec):
        if name is not None:
            plan[f"{blocks}.{name}" if blocks else name] = spec

    for name in (q, k, v):
        put(name, {"style": "column", "unit": head_dim})
    put(qkv, {"style": "column", "unit": head_dim, "parts": 3})
    put(out, {"style": "row", "unit": head_dim})
    put(up, {"style": "column", "activation": activation} if activation else "column")
    put(down, "row")
    if not plan:
        raise ValueError("transformer_plan: name at least one projection")
    return plan


def sequence_slice(total, ctx):
    """This rank's slice of ``total`` rows split evenly (even_split): what a
    parallelized model's input is under sequence parallelism."""
    sizes = even_split(total, ctx.size)
    lo = sum(sizes[:ctx.rank])
    return slice(lo, lo + sizes[ctx.rank])
