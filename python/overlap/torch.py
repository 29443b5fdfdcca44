"""overlap.torch: Megatron-style tensor-parallel linear layers, with
sequence parallelism or without, whose collectives overlap their GEMMs
(overlap's ops).

Activations between the layers are sharded by sequence: each rank holds its
rows of a [sequence * batch, hidden] activation (sequence-first, so the rows
of one rank are contiguous). Weights use torch's layout (out x in):

- ColumnParallelLinear: this rank's output features. Forward is
  all_gather_matmul (the sequence gathered while the pieces compute); the
  backward's input gradient is matmul_reduce_scatter, started, while the
  weight gradient computes from the gathered input kept from the forward.
- ColumnParallelLinear with several weights (``out_features`` a list, e.g.
  Q, K and V): one gather for every product, forward and backward; the
  input is gathered again for the weight gradients instead of being kept.
- RowParallelLinear: this rank's input features. Forward is
  matmul_reduce_scatter back to sequence shards; backward is
  all_gather_matmul.

Parameters every rank holds whole (the row layer's bias, layer norms,
embeddings) get partial gradients from each rank's sequence shard: mark
them with ``sequence_parallel = True`` (the row bias is) and sum them with
``allreduce_replicated_grads`` before the optimizer steps.

Without sequence parallelism (``sequence_parallel=False``) every rank holds
all rows of the activations between the layers, as in inference and in
Megatron without it:

- ColumnParallelLinear: forward is a local product; the backward's input
  gradient is matmul_all_reduce, started, while the weight gradients
  compute.
- RowParallelLinear: forward is matmul_all_reduce (the sum whole on every
  rank); backward is local. Its bias gradient is whole on every rank
  already, so the bias is not marked ``sequence_parallel``.

Every layer takes ``strategy`` ("bulk", "ring", "automatic", ...), so the
same model runs bulk or overlapped. One op per context is in flight at a
time; the layers wait for theirs before returning.
"""

import math

import torch
from torch import nn

import overlap

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "allreduce_replicated_grads", "even_split"]


def even_split(total, ranks):
    """The sizes of ``total`` split over ``ranks`` as evenly as possible (the
    first ranks take one more), as overlap splits an output it allocates."""
    return [total // ranks + (1 if r < total % ranks else 0) for r in range(ranks)]


def _rows(t):
    """t as a 2-D row-major matrix of its last dimension (a view when it can be).
    The row count is spelled out: with no features (an empty shard) -1 is ambiguous."""
    t = t.reshape(math.prod(t.shape[:-1]), t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def _joined(ts, dim):
    """The tensors side by side along ``dim``: the one itself when there is one
    (torch.cat would copy it, a weight's worth on every backward step)."""
    return ts[0] if len(ts) == 1 else torch.cat(ts, dim)


def _shaped(y, shape):
    """y (rows x features) with the inner dimensions of ``shape`` (the input's) again."""
    if len(shape) <= 2:
        return y
    inner = math.prod(shape[1:-1])
    return y.reshape(y.shape[0] // inner if inner else 0, *shape[1:-1], y.shape[-1])


class ColumnParallelLinear(nn.Module):
    """A linear layer whose output features are split over the ranks of
    ``ctx``: this rank holds ``out_features`` of them (a list: one weight
    each, sharing one gather, e.g. [q, k, v]). The input is this rank's
    sequence shard [rows, in_features]; the output has every rank's rows
    (in rank order) of this rank's features (a list of outputs for a list).
    With ``sequence_parallel=False`` the input is every row, the same on
    every rank, and so is the output's.
    """

    def __init__(self, ctx, in_features, out_features, bias=True, strategy="automatic", dtype=None,
                 sequence_parallel=True):
        super().__init__()
        self.ctx, self.strategy, self.sequence_parallel = ctx, strategy, sequence_parallel
        self.fused = isinstance(out_features, (list, tuple))
        outs = list(out_features) if self.fused else [out_features]
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.empty(n, in_features, dtype=dtype)) for n in outs])
        self.biases = nn.ParameterList(
            [nn.Parameter(torch.zeros(n, dtype=dtype)) for n in outs]) if bias else None
        for w in self.weights:
            nn.init.normal_(w, std=0.02)

    def forward(self, x):
        shape = x.shape
        x2 = _rows(x)
        if not self.sequence_parallel:
            ys = _LocalColumn.apply(self.ctx, self.strategy, x2, *self.weights)
            if self.biases is not None:
                ys = [y + b for y, b in zip(ys, self.biases)]
            ys = [_shaped(y, shape) for y in ys]
            return ys if self.fused else ys[0]
        if not self.fused:
            b = self.biases[0] if self.biases is not None else None
            y = _Column.apply(x2, self.weights[0], b, self.ctx, self.strategy)
            return _shaped(y, shape)
        ys = _FusedColumn.apply(self.ctx, self.strategy, x2, *self.weights)
        if self.biases is not None:
            ys = [y + b for y, b in zip(ys, self.biases)]
        return [_shaped(y, shape) for y in ys]


class _Column(torch.autograd.Function):
    """y = AG(x) @ w.T + b; backward: dx = RS(dy @ w) started, dw from the
    gathered input meanwhile."""

    @staticmethod
    def forward(fctx, x, w, b, octx, strategy):
        y, gathered = overlap.all_gather_matmul(octx, x, w.t(), bias=b, strategy=strategy, gathered_out=True)
        fctx.save_for_backward(gathered, w)
        fctx.octx, fctx.strategy, fctx.has_bias, fctx.rows = octx, strategy, b is not None, x.shape[0]
        return y

    @staticmethod
    def backward(fctx, dy):
        gathered, w = fctx.saved_tensors
        dy = _rows(dy)
        dx = torch.empty((fctx.rows, w.shape[1]), dtype=dy.dtype)
        pending = overlap.start_matmul_reduce_scatter(fctx.octx, dy, w, dx, strategy=fctx.strategy)
        dw = dy.t().mm(gathered)  # computed while the reduce-scatter runs
        db = dy.sum(0) if fctx.has_bias else None
        pending.wait()
        return dx, dw, db, None, None


class _FusedColumn(torch.autograd.Function):
    """ys[i] = AG(x) @ ws[i].T with one gather (the several-products form);
    backward: dx = RS(cat(dys) @ cat(ws)), and the weight gradients
    dws[i].T = AG(x).T @ dys[i] as one all_gather_matmul of x.T (lhs_cols)."""

    @staticmethod
    def forward(fctx, octx, strategy, x, *ws):
        ys = overlap.all_gather_matmul(octx, x, [w.t() for w in ws], strategy=strategy)
        fctx.save_for_backward(x, *ws)
        fctx.octx, fctx.strategy = octx, strategy
        return tuple(ys)

    @staticmethod
    def backward(fctx, *dys):
        x, *ws = fctx.saved_tensors
        dys = [_rows(d) for d in dys]
        dx = torch.empty_like(x)
        overlap.matmul_reduce_scatter(fctx.octx, _joined(dys, 1), _joined(ws, 0), dx, strategy=fctx.strategy)
        dwts = overlap.all_gather_matmul(fctx.octx, x.t(), dys, gathered="lhs_cols", strategy=fctx.strategy)
        return (None, None, dx, *[d.t() for d in dwts])


class _LocalColumn(torch.autograd.Function):
    """ys[i] = x @ ws[i].T on every row (no sequence parallelism); backward:
    dx = AR(cat(dys) @ cat(ws)) started, the weight gradients meanwhile."""

    @staticmethod
    def forward(fctx, octx, strategy, x, *ws):
        fctx.save_for_backward(x, *ws)
        fctx.octx, fctx.strategy = octx, strategy
        return tuple(x.mm(w.t()) for w in ws)

    @staticmethod
    def backward(fctx, *dys):
        x, *ws = fctx.saved_tensors
        dys = [_rows(d) for d in dys]
        dx = torch.empty_like(x)
        pending = overlap.start_matmul_all_reduce(fctx.octx, _joined(dys, 1), _joined(ws, 0), dx,
                                                  strategy=fctx.strategy)
        dws = [d.t().mm(x) for d in dys]  # computed while the all-reduce runs
        pending.wait()
        return (None, None, dx, *dws)


class _AllReducedRow(torch.autograd.Function):
    """z = AR(y @ w.T) + b, whole on every rank (no sequence parallelism);
    backward: dy = dz @ w and dw = dz.T @ y, local."""

    @staticmethod
    def forward(fctx, y, w, b, octx, strategy):
        z = overlap.matmul_all_reduce(octx, y, w.t(), bias=b, strategy=strategy)
        fctx.save_for_backward(y, w)
        fctx.has_bias = b is not None
        return z

    @staticmethod
    def backward(fctx, dz):
        y, w = fctx.saved_tensors
        dz = _rows(dz)
        db = dz.sum(0) if fctx.has_bias else None  # whole: dz is the same on every rank
        return dz.mm(w), dz.t().mm(y), db, None, None


class _Row(torch.autograd.Function):
    """z = RS(y @ w.T) + b (this rank's rows); backward: dy = AG(dz) @ w,
    keeping AG(dz) for dw."""

    @staticmethod
    def forward(fctx, y, w, b, octx, strategy, rows):
        z = torch.empty((rows, w.shape[0]), dtype=y.dtype)
        overlap.matmul_reduce_scatter(octx, y, w.t(), z, bias=b, strategy=strategy)
        fctx.save_for_backward(y, w)
        fctx.octx, fctx.strategy, fctx.has_bias = octx, strategy, b is not None
        return z

    @staticmethod
    def backward(fctx, dz):
        y, w = fctx.saved_tensors
        dz = _rows(dz)
        dy, gathered = overlap.all_gather_matmul(fctx.octx, dz, w, strategy=fctx.strategy, gathered_out=True)
        dw = gathered.t().mm(y)
        db = dz.sum(0) if fctx.has_bias else None  # partial: summed over ranks by allreduce_replicated_grads
        return dy, dw, db, None, None, None


class RowParallelLinear(nn.Module):
    """A linear layer whose input features are split over the ranks of
    ``ctx``: this rank holds ``in_features`` of them. The input has every
    rank's rows of this rank's features; the output is this rank's sequence
    shard of all ``out_features``, summed over the ranks. ``forward(y,
    rows)``: rows is this rank's shard (default: the even split, as
    even_split gives). The bias is whole on every rank (sequence_parallel).
    With ``sequence_parallel=False`` the output is every row of the sum, the
    same on every rank (``rows`` is not taken), and so is the bias's
    gradient (the bias is not marked).
    """

    def __init__(self, ctx, in_features, out_features, bias=True, strategy="automatic", dtype=None,
                 sequence_parallel=True):
        super().__init__()
        self.ctx, self.strategy, self.sequence_parallel = ctx, strategy, sequence_parallel
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None
        if self.bias is not None and sequence_parallel:
            self.bias.sequence_parallel = True

    def forward(self, y, rows=None):
        shape = y.shape
        y2 = _rows(y)
        if not self.sequence_parallel:
            if rows is not None:
                raise ValueError("RowParallelLinear(sequence_parallel=False) outputs every row: rows is not taken")
            z = _AllReducedRow.apply(y2, self.weight, self.bias, self.ctx, self.strategy)
            return _shaped(z, shape)
        if rows is None:
            rows = even_split(y2.shape[0], self.ctx.size)[self.ctx.rank]
        z = _Row.apply(y2, self.weight, self.bias, self.ctx, self.strategy, rows)
        return _shaped(z, shape)


def allreduce_replicated_grads(params, comm):
    """Sums the gradients of the parameters of ``params`` marked
    ``sequence_parallel`` over the ranks of ``comm`` (an mpi4py
    communicator), in place, in one message: in float64 when any gradient
    is float64, else in float32 (bfloat16 gradients are summed widened)."""
    from mpi4py import MPI

    grads = [p.grad for p in params if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not grads or comm.size == 1:
        return
    wide = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    flat = torch.cat([g.reshape(-1).to(wide) for g in grads])
    comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
    at = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[at:at + n].view_as(g))
        at += n
