"""A mixture-of-experts MLP with expert parallelism whose token exchanges
overlap the experts' GEMMs (overlap's all_to_all_matmul and
matmul_all_to_all), forward and backward.

Every rank holds ``experts_per_rank`` experts (global expert g is local
expert g % E of rank g // E) and its own token rows. A forward pass:

1. routes each token to its top-k experts by a linear router (softmax over
   the k chosen logits gives the gates; torch.topk picks the experts);
2. dispatches each (token, expert) row to its expert's rank while the rows
   already there go through the expert's first GEMM (all_to_all_matmul);
3. applies GELU on the expert's rank;
4. runs the expert's second GEMM while the results return (combine,
   matmul_all_to_all);
5. sums each token's k rows weighted by its gates.

No token is dropped. The backward pass runs the same two ops the other way
(with transpose_w): combine's gradient is a dispatch, dispatch's a combine.
The first expert GEMM's weight gradient computes while the input gradient's
exchange runs (started).

The router is whole on every rank; its gradient from this rank's tokens is
partial, so it is marked ``sequence_parallel`` and summed over the ranks by
``allreduce_replicated_grads``, as the replicated parameters of the
tensor-parallel layers are. The experts' gradients are complete.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import overlap

from . import functions as fn


def _expert_of_rows(counts):
    """Each received row's local expert (rows ordered by source rank, then expert)."""
    e = torch.arange(counts.experts).repeat(len(counts.recv) // max(counts.experts, 1))
    return torch.repeat_interleave(e, torch.tensor(counts.recv, dtype=torch.long))


def _per_expert_grad(counts, left, right):
    """[E, left cols, right cols]: for each local expert, left's rows of it
    transposed times right's (its weight's gradient)."""
    E = counts.experts
    grads = left.new_zeros(E, left.shape[1], right.shape[1])
    of = _expert_of_rows(counts)
    for e in range(E):
        rows = (of == e).nonzero().squeeze(1)
        if rows.numel():
            grads[e] = left.index_select(0, rows).t().mm(right.index_select(0, rows))
    return grads


class Dispatch(torch.autograd.Function):
    """h = each received row times its expert's w1 (all_to_all_matmul),
    keeping the received rows; backward: dx = combine(dh @ w1[e].T)
    started, dw1 from the kept rows meanwhile."""

    @staticmethod
    def forward(fctx, x, w1, octx, counts, strategy):
        E, K, F_ = w1.shape
        h, moved = overlap.all_to_all_matmul(octx, x, w1.reshape(E * K, F_), counts, strategy=strategy,
                                             dispatched_out=True)
        fctx.save_for_backward(moved, w1)
        fctx.octx, fctx.counts, fctx.strategy, fctx.rows = octx, counts, strategy, x.shape[0]
        return h

    @staticmethod
    def backward(fctx, dh):
        moved, w1 = fctx.saved_tensors
        E, K, F_ = w1.shape
        dh = fn.rows_of(dh)
        dx = torch.empty((fctx.rows, K), dtype=dh.dtype)
        pending = overlap.start_matmul_all_to_all(fctx.octx, dh, w1.reshape(E * K, F_), fctx.counts, dx,
                                                  strategy=fctx.strategy, transpose_w=True)
        dw1 = _per_expert_grad(fctx.counts, moved, dh)  # computed while the exchange runs
        pending.wait()
        return dx, dw1, None, None, None


class Combine(torch.autograd.Function):
    """out = each row times its expert's w2, returned to its token's rank
    (matmul_all_to_all); backward: da = dispatch(dout) @ w2[e].T, keeping
    the dispatched gradient for dw2."""

    @staticmethod
    def forward(fctx, a, w2, octx, counts, strategy):
        E, F_, K = w2.shape
        out = overlap.matmul_all_to_all(octx, a, w2.reshape(E * F_, K), counts, strategy=strategy)
        fctx.save_for_backward(a, w2)
        fctx.octx, fctx.counts, fctx.strategy = octx, counts, strategy
        return out

    @staticmethod
    def backward(fctx, dout):
        a, w2 = fctx.saved_tensors
        E, F_, K = w2.shape
        da, moved = overlap.all_to_all_matmul(fctx.octx, fn.rows_of(dout), w2.reshape(E * F_, K), fctx.counts,
                                              strategy=fctx.strategy, transpose_w=True, dispatched_out=True)
        return da, _per_expert_grad(fctx.counts, a, moved), None, None, None


class ExpertParallelMLP(nn.Module):
    """A mixture-of-experts MLP, ``experts_per_rank`` experts on each rank of
    ``ctx``: y = sum over the token's top-``topk`` experts of gate *
    (gelu(x @ w1[g]) @ w2[g]). Input and output are this rank's token rows
    [..., width]; any rank may have none.

    Parameters: ``router`` (every rank's experts x width, whole on every
    rank, marked ``sequence_parallel``), ``w1`` (E x width x ffn) and ``w2``
    (E x ffn x width), this rank's experts. They start from torch's
    generator: every rank draws the whole router and every expert (uniform
    in +-1/sqrt(fan-in), as nn.Linear draws), so ranks seeded alike hold the
    parts of one model. ``strategy``: "automatic", "bulk" or "pairwise".
    After forward, ``load`` holds the token rows each local expert received
    (a list of E). Constructing and calling are collective over ctx.
    """

    def __init__(self, ctx, width, ffn, experts_per_rank, topk=2, strategy="automatic", dtype=None):
        super().__init__()
        E, R = experts_per_rank, ctx.size
        if E <= 0 or not 1 <= topk <= E * R:
            raise ValueError(f"ExpertParallelMLP: experts_per_rank must be positive and topk in 1..{E * R} "
                             f"(got {E} and {topk})")
        self.ctx, self.strategy, self.topk = ctx, strategy, topk
        self.width, self.ffn, self.experts_per_rank = width, ffn, E
        router = torch.empty(E * R, width, dtype=dtype).uniform_(-1 / math.sqrt(width), 1 / math.sqrt(width))
        w1 = torch.empty(E * R, width, ffn, dtype=dtype).uniform_(-1 / math.sqrt(width), 1 / math.sqrt(width))
        w2 = torch.empty(E * R, ffn, width, dtype=dtype).uniform_(-1 / math.sqrt(ffn), 1 / math.sqrt(ffn))
        lo = ctx.rank * E
        self.router = nn.Parameter(router)
        self.router.sequence_parallel = True
        self.w1 = nn.Parameter(w1[lo:lo + E].clone())
        self.w2 = nn.Parameter(w2[lo:lo + E].clone())
        self.load = [0] * E

    def extra_repr(self):
        return (f"width={self.width}, ffn={self.ffn}, experts_per_rank={self.experts_per_rank}, "
                f"experts={self.router.shape[0]}, topk={self.topk}, strategy={self.strategy!r}")

    def forward(self, x):
        shape = x.shape
        x2 = fn.rows_of(x)
        T, k = x2.shape[0], self.topk
        chosen, experts = x2.mm(self.router.t()).topk(k, dim=1)
        gates = F.softmax(chosen, dim=1).reshape(-1)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # by destination rank, then its expert
        token = torch.arange(T).repeat_interleave(k).index_select(0, order)
        send = torch.bincount(flat, minlength=self.router.shape[0])
        counts = overlap.exchange_expert_counts(self.ctx, self.experts_per_rank, send)
        self.load = [sum(counts.recv[e::self.experts_per_rank]) for e in range(self.experts_per_rank)]
        h = Dispatch.apply(x2.index_select(0, token), self.w1, self.ctx, counts, self.strategy)
        out = Combine.apply(F.gelu(h), self.w2, self.ctx, counts, self.strategy)
        y = x2.new_zeros(T, self.width).index_add(0, token, out * gates.index_select(0, order).unsqueeze(1))
        return y.reshape(*shape[:-1], self.width)
