"""Megatron-style tensor-parallel linear layers whose collectives overlap
their GEMMs (overlap's ops), with sequence parallelism or without.

Both layers keep nn.Linear's names and layout on each rank: ``weight``
(out x in, this rank's block) and ``bias``, ``in_features`` and
``out_features`` (this rank's), and nn.Linear's initialisation by default.

With sequence parallelism (the default) the activations between the
layers are sharded by their first dimension: each rank holds its rows (for
a sequence-first ``[seq, batch, hidden]`` activation, its part of the
sequence; the rows of one rank are contiguous).

- ColumnParallelLinear: this rank's output features. Forward is
  all_gather_matmul (every rank's rows gathered while the pieces compute);
  the backward's input gradient is matmul_reduce_scatter, started, while the
  weight gradient computes from the gathered input kept from the forward.
- ColumnParallelLinear with several weights (``out_features`` a list, e.g.
  Q, K and V): one gather for every product, forward and backward; its
  parameters are ``weights`` and ``biases`` (lists), the input is gathered
  again for the weight gradients instead of being kept.
- RowParallelLinear: this rank's input features. Forward is
  matmul_reduce_scatter back to this rank's rows; backward is
  all_gather_matmul.

Without sequence parallelism every rank holds all rows:
ColumnParallelLinear is local forward and all-reduces the input's gradient
(started, beside the weight gradients); RowParallelLinear's forward is
matmul_all_reduce.

Parameters every rank holds whole (the row layer's bias, layer norms,
embeddings) get partial gradients from each rank's rows under sequence
parallelism: they are marked ``sequence_parallel = True`` (the row bias is;
overlap.torch.parallelize marks the rest) and summed by
``allreduce_replicated_grads`` before the optimizer steps.

Every layer takes ``strategy`` ("bulk", "ring", "automatic", ...), so the
same model runs bulk or overlapped, and ``activation`` (None, "relu",
"gelu"), fused into the op (functions.py says how its backward runs). One
op per context is in flight at a time; the layers wait for theirs before
returning. Constructing a layer is collective over the context (every rank
constructs its layers in the same order).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import functions as fn


def even_split(total, ranks):
    """The sizes of ``total`` split over ``ranks`` as evenly as possible (the
    first ranks take one more), as overlap splits an output it allocates."""
    return [total // ranks + (1 if r < total % ranks else 0) for r in range(ranks)]


def _shaped(y, shape):
    """y (rows x features) with the inner dimensions of ``shape`` (the input's) again."""
    if len(shape) <= 2:
        return y
    inner = math.prod(shape[1:-1])
    return y.reshape(y.shape[0] // inner if inner else 0, *shape[1:-1], y.shape[-1])


def _linear_init(out_features, in_features, dtype, bias):
    """A whole weight (and bias) drawn as nn.Linear(in_features, out_features)
    draws them from torch's generator: kaiming-uniform with a = sqrt(5),
    the bias uniform in +-1/sqrt(in_features)."""
    w = torch.empty(out_features, in_features, dtype=dtype)
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    b = None
    if bias:
        bound = 1 / math.sqrt(in_features) if in_features > 0 else 0
        b = torch.empty(out_features, dtype=dtype).uniform_(-bound, bound)
    return w, b


def _offset(sizes, rank):
    return sum(sizes[:rank])


def _leading_rows(ctx, y):
    """A row layer's rows when not given: this rank's count of the first
    dimension that the last column-parallel layer on ``ctx`` received (the
    even split of y's first dimension before any has run), times y's inner
    dimensions."""
    leading = getattr(ctx, "_overlap_leading_rows", None)
    if leading is None:
        leading = even_split(y.shape[0], ctx.size)[ctx.rank]
    return leading * (math.prod(y.shape[1:-1]) if y.dim() > 2 else 1)


class ColumnParallelLinear(nn.Module):
    """A linear layer whose output features are split over the ranks of
    ``ctx``: this rank holds ``out_features`` of them (a list: one weight
    each, sharing one gather, e.g. [q, k, v]). The input is this rank's rows
    [rows, ..., in_features]; the output has every rank's rows (in rank
    order) of this rank's features (a list of outputs for a list). With
    ``sequence_parallel=False`` the input is every row, the same on every
    rank, and so is the output's.

    ``activation`` (None, "relu", "gelu") applies after the bias, fused into
    the op (the list form applies bias and activation after it). The
    weights start as the rows of this rank of nn.Linear(in_features, sum of
    every rank's out_features) drawn from torch's generator (every rank
    draws the whole weight once): ranks seeded alike hold the blocks of
    one such layer. Collective over ctx.
    """

    def __init__(self, ctx, in_features, out_features, bias=True, strategy="automatic", dtype=None,
                 sequence_parallel=True, activation=None, _init=True):
        super().__init__()
        self.ctx, self.strategy, self.sequence_parallel = ctx, strategy, sequence_parallel
        self.activation = fn.checked_activation(activation)
        self.fused = isinstance(out_features, (list, tuple))
        outs = list(out_features) if self.fused else [out_features]
        self.in_features, self.out_features = in_features, (outs if self.fused else out_features)
        self.parts, self.unit = 1, 1  # set by parallelize: how the whole layer's rows were split
        params = [self._params(ctx, in_features, i, outs, bias, dtype, _init) for i in range(len(outs))]
        if self.fused:
            self.weights = nn.ParameterList([w for w, _ in params])
            self.biases = nn.ParameterList([b for _, b in params]) if bias else None
        else:
            self.weight = params[0][0]
            self.bias = params[0][1]

    @staticmethod
    def _params(ctx, in_features, i, outs, bias, dtype, init):
        """Weight i and its bias: this rank's rows of a whole nn.Linear draw."""
        if not init:
            w = torch.empty(outs[i], in_features, dtype=dtype)
            b = torch.zeros(outs[i], dtype=dtype) if bias else None
        else:
            sizes = [o[i] for o in ctx.comm.allgather(outs)]
            lo = _offset(sizes, ctx.rank)
            whole_w, whole_b = _linear_init(sum(sizes), in_features, dtype, bias)
            w = whole_w[lo:lo + outs[i]].clone()
            b = whole_b[lo:lo + outs[i]].clone() if bias else None
        return nn.Parameter(w), (nn.Parameter(b) if b is not None else None)

    def sharded(self):
        """(parameter name, dimension split over the ranks) of each parameter."""
        if self.fused:
            names = [f"weights.{i}" for i in range(len(self.weights))]
            names += [f"biases.{i}" for i in range(len(self.biases))] if self.biases is not None else []
        else:
            names = ["weight"] + (["bias"] if self.bias is not None else [])
        return [(n, 0) for n in names]

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} (this rank's), "
                f"strategy={self.strategy!r}, activation={self.activation!r}, "
                f"sequence_parallel={self.sequence_parallel}")

    def forward(self, x):
        shape = x.shape
        x2 = fn.rows_of(x)
        if not self.sequence_parallel:
            return self._local(x2, shape)
        self.ctx._overlap_leading_rows = shape[0] if x.dim() > 2 else x2.shape[0]
        if self.fused:
            ys = fn.FusedColumn.apply(self.ctx, self.strategy, x2, *self.weights)
            return [_shaped(y, shape) for y in self._finish(ys)]
        act = fn.Activation(self.activation, fn.needs_grad(x, self.weight, self.bias))
        return _shaped(fn.Column.apply(x2, self.weight, self.bias, self.ctx, self.strategy, act), shape)

    def _local(self, x2, shape):
        ws = list(self.weights) if self.fused else [self.weight]
        ys = self._finish(fn.LocalColumn.apply(self.ctx, self.strategy, x2, *ws))
        ys = [_shaped(y, shape) for y in ys]
        return ys if self.fused else ys[0]

    def _finish(self, ys):
        """Bias and activation after an op that applied neither (plain torch)."""
        bs = (list(self.biases) if self.fused else [self.bias]) if self._has_bias() else [None] * len(ys)
        out = []
        for y, b in zip(ys, bs):
            y = y + b if b is not None else y
            if self.activation == "relu":
                y = F.relu(y)
            elif self.activation == "gelu":
                y = F.gelu(y)
            out.append(y)
        return out

    def _has_bias(self):
        return (self.biases if self.fused else self.bias) is not None


class RowParallelLinear(nn.Module):
    """A linear layer whose input features are split over the ranks of
    ``ctx``: this rank holds ``in_features`` of them. The input has every
    rank's rows of this rank's features; the output is this rank's rows of
    all ``out_features``, summed over the ranks, then the bias and the
    ``activation`` (fused into the op). ``forward(y, rows=None)``: rows is
    this rank's row count (default: this rank's count of the first dimension
    that the last ColumnParallelLinear on the context received, times y's
    inner dimensions; before any, the even split of y's first dimension).
    The bias is whole on every rank (marked ``sequence_parallel``).

    With ``sequence_parallel=False`` the output is every row of the sum, the
    same on every rank (``rows`` is not taken), and so is the bias's
    gradient (the bias is not marked).

    The weight starts as this rank's columns of nn.Linear(sum of every
    rank's in_features, out_features) drawn from torch's generator, and the
    bias as rank 0's draw. Collective over ctx.
    """

    def __init__(self, ctx, in_features, out_features, bias=True, strategy="automatic", dtype=None,
                 sequence_parallel=True, activation=None, _init=True):
        super().__init__()
        self.ctx, self.strategy, self.sequence_parallel = ctx, strategy, sequence_parallel
        self.activation = fn.checked_activation(activation)
        self.in_features, self.out_features = in_features, out_features
        self.parts, self.unit = 1, 1
        if _init:
            sizes = ctx.comm.allgather(in_features)
            lo = _offset(sizes, ctx.rank)
            whole_w, whole_b = _linear_init(out_features, sum(sizes), dtype, bias)
            w = whole_w[:, lo:lo + in_features].clone()
            b = ctx.comm.bcast(whole_b, root=0) if bias else None
        else:
            w = torch.empty(out_features, in_features, dtype=dtype)
            b = torch.zeros(out_features, dtype=dtype) if bias else None
        self.weight = nn.Parameter(w)
        self.bias = nn.Parameter(b) if b is not None else None
        if self.bias is not None and sequence_parallel:
            self.bias.sequence_parallel = True

    def sharded(self):
        """(parameter name, dimension split over the ranks) of each parameter."""
        return [("weight", 1)]

    def extra_repr(self):
        return (f"in_features={self.in_features} (this rank's), out_features={self.out_features}, "
                f"strategy={self.strategy!r}, activation={self.activation!r}, "
                f"sequence_parallel={self.sequence_parallel}")

    def forward(self, y, rows=None):
        shape = y.shape
        y2 = fn.rows_of(y)
        act = fn.Activation(self.activation, fn.needs_grad(y, self.weight, self.bias))
        if not self.sequence_parallel:
            if rows is not None:
                raise ValueError("RowParallelLinear(sequence_parallel=False) outputs every row: rows is not taken")
            z = fn.AllReducedRow.apply(y2, self.weight, self.bias, self.ctx, self.strategy, act)
            return _shaped(z, shape)
        if rows is None:
            rows = _leading_rows(self.ctx, y)
        z = fn.Row.apply(y2, self.weight, self.bias, self.ctx, self.strategy, rows, act)
        return _shaped(z, shape)
