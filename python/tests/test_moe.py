"""The token exchange from Python: all_to_all_matmul and matmul_all_to_all
on NumPy arrays and torch tensors against products of every rank's inputs
(each rank regenerates them from their seeds), bad input on one rank, and
overlap.torch.ExpertParallelMLP: gradcheck in float64 and its output and
gradients against a plain single-process loop."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import rng_for
from test_torch import _Gathered, _Replicated, inputs, part, uneven

import overlap
from overlap.torch import ExpertParallelMLP, allreduce_replicated_grads

K, N = 5, 3  # model width, an expert's inner width


def routing(R, E, r):
    """Rank r's send counts: uneven, some zero; rank 1 sends nothing at 3 ranks or more."""
    if R >= 3 and r == 1:
        return [0] * (R * E)
    return [(r * 7 + q * 3 + e * 5) % 4 for q in range(R) for e in range(E)]


def recv_of(R, E, p):
    return [routing(R, E, q)[p * E + e] for q in range(R) for e in range(E)]


def data(seed, rows, cols, dtype):
    return rng_for(seed).standard_normal((rows, cols)).astype(dtype)


@pytest.mark.parametrize("strategy", ["bulk", "pairwise", "automatic"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("E", [1, 2])
def test_ops_match_every_ranks_products(ctx, strategy, dtype, E):
    R, p = ctx.size, ctx.rank
    counts = overlap.exchange_expert_counts(ctx, E, np.array(routing(R, E, p)))
    assert list(counts.recv) == recv_of(R, E, p) and counts.experts == E
    x_of = lambda r: data(10 + r, sum(routing(R, E, r)), K, dtype)  # noqa: E731
    w1_of = lambda r: data(20 + r, E * K, N, dtype)  # noqa: E731
    y, moved = overlap.all_to_all_matmul(ctx, x_of(p), w1_of(p), counts, strategy=strategy, dispatched_out=True)
    # Rows by source rank q, then expert e: q's rows for (p, e) times w1[e].
    want, want_moved = [], []
    for q in range(R):
        send, xq = routing(R, E, q), x_of(q).astype(np.float64)
        for e in range(E):
            lo = sum(send[:p * E + e])
            block = xq[lo:lo + send[p * E + e]]
            want.append(block @ w1_of(p).astype(np.float64)[e * K:(e + 1) * K])
            want_moved.append(block)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, np.concatenate(want), rtol=tol, atol=tol)
    np.testing.assert_array_equal(moved, np.concatenate(want_moved).astype(dtype))

    # Combine: this rank's rows in x's order, each from the rank that holds its expert.
    h_of = lambda r: data(30 + r, sum(recv_of(R, E, r)), N, dtype)  # noqa: E731
    w2_of = lambda r: data(40 + r, E * N, K, dtype)  # noqa: E731
    out = overlap.matmul_all_to_all(ctx, h_of(p), w2_of(p), counts, strategy=strategy)
    back = []
    for q in range(R):
        recv, hq = recv_of(R, E, q), h_of(q).astype(np.float64)
        for e in range(E):
            lo = sum(recv[:p * E + e])
            back.append(hq[lo:lo + recv[p * E + e]] @ w2_of(q).astype(np.float64)[e * N:(e + 1) * N])
    np.testing.assert_allclose(out, np.concatenate(back), rtol=tol, atol=tol)


def test_torch_bf16_transpose_w_and_started(ctx):
    """bfloat16 tensors, each expert's weight read transposed, and the started forms."""
    R, p, E = ctx.size, ctx.rank, 2
    counts = overlap.exchange_expert_counts(ctx, E, routing(R, E, p))
    x_of = lambda r: torch.from_numpy(data(50 + r, sum(routing(R, E, r)), K, np.float32))  # noqa: E731
    w_of = lambda r: torch.from_numpy(data(60 + r, E * K, N, np.float32))  # noqa: E731
    # transpose_w: expert e's K x N weight stored as its N x K transpose.
    wt = torch.cat([blk.t() for blk in w_of(p).split(K)]).contiguous()
    y = overlap.start_all_to_all_matmul(ctx, x_of(p).bfloat16(), wt.bfloat16(), counts, strategy="pairwise",
                                        transpose_w=True).wait()
    assert y.dtype == torch.bfloat16 and y.shape == (counts.received_rows, N)
    want = []
    for q in range(R):
        send, xq = routing(R, E, q), x_of(q).bfloat16().double()
        for e in range(E):
            lo = sum(send[:p * E + e])
            want.append(xq[lo:lo + send[p * E + e]] @ w_of(p).bfloat16().double()[e * K:(e + 1) * K])
    torch.testing.assert_close(y.double(), torch.cat(want), rtol=2e-2, atol=2e-2)
    # Combine, started: h's rows times each expert's N x K weight, stored transposed (E * K x N).
    h_of = lambda r: torch.from_numpy(data(70 + r, sum(recv_of(R, E, r)), N, np.float32))  # noqa: E731
    w2_of = lambda r: torch.from_numpy(data(80 + r, E * N, K, np.float32))  # noqa: E731
    w2t = torch.cat([blk.t() for blk in w2_of(p).split(N)]).contiguous()
    out = overlap.start_matmul_all_to_all(ctx, h_of(p).bfloat16(), w2t.bfloat16(), counts, strategy="pairwise",
                                          transpose_w=True).wait()
    back = []
    for q in range(R):
        recv, hq = recv_of(R, E, q), h_of(q).bfloat16().double()
        for e in range(E):
            lo = sum(recv[:p * E + e])
            back.append(hq[lo:lo + recv[p * E + e]] @ w2_of(q).bfloat16().double()[e * N:(e + 1) * N])
    torch.testing.assert_close(out.double(), torch.cat(back), rtol=2e-2, atol=2e-2)


def test_bad_input_on_one_rank_raises_everywhere(ctx):
    R, p, E = ctx.size, ctx.rank, 2
    counts = overlap.exchange_expert_counts(ctx, E, routing(R, E, p))
    x = data(1, counts.sent_rows, K, np.float64)
    w = data(2, E * K, N, np.float64)
    last = R - 1
    with pytest.raises(TypeError, match="ExpertCounts"):
        overlap.all_to_all_matmul(ctx, x, w, counts if p != 0 else [1, 2])
    bad = np.zeros((counts.sent_rows + 1, K)) if p == last else x
    with pytest.raises(ValueError, match=f"rank {last}"):
        overlap.all_to_all_matmul(ctx, bad, w, counts)
    w2 = data(3, E * N + (1 if p == 0 else 0), K, np.float64)  # one row too many on rank 0
    with pytest.raises(ValueError, match="rank 0: w must be"):
        overlap.matmul_all_to_all(ctx, data(4, counts.received_rows, N, np.float64), w2, counts)
    with pytest.raises(ValueError):
        overlap.exchange_expert_counts(ctx, E, routing(R, E, p)[:-1] if p == last else routing(R, E, p))
    # The context still runs a valid call.
    y = overlap.all_to_all_matmul(ctx, x, w, counts, strategy="pairwise")
    assert y.shape == (counts.received_rows, N)


# ------------------------------------------------------------- the layer


def moe_reference(x, router, w1, w2, topk):
    """The layer on one process, token by token, in plain torch."""
    rows = []
    for t in range(x.shape[0]):
        chosen, experts = (x[t] @ router.t()).topk(topk)
        gates = F.softmax(chosen, dim=0)
        rows.append(sum(g * (F.gelu(x[t] @ w1[e]) @ w2[e]) for g, e in zip(gates, experts.tolist())))
    return torch.stack(rows) if rows else x.new_zeros(0, w2.shape[2])


@pytest.mark.parametrize("E,topk,strategy", [(1, 1, "pairwise"), (2, 2, "bulk"), (2, 3, "pairwise"),
                                             (3, 2, "automatic")])
def test_layer_gradcheck(ctx, comm, E, topk, strategy):
    R, S, H, FF = comm.size, 2 * comm.size + 3, 3, 4
    topk = min(topk, E * R)
    rows = uneven(S, R)  # rank 1 has no tokens at 3 ranks or more
    torch.manual_seed(7)
    layer = ExpertParallelMLP(ctx, H, FF, E, topk=topk, strategy=strategy, dtype=torch.float64)
    experts = [E] * R

    def f(x, router, w1, w2):
        x, router, w1, w2 = (_Replicated.apply(t, comm) for t in (x, router, w1, w2))
        params = {"router": router, "w1": part(w1, experts, comm.rank, 0), "w2": part(w2, experts, comm.rank, 0)}
        y = torch.nn.utils.stateless.functional_call(layer, params, (part(x, rows, comm.rank, 0),))
        return _Gathered.apply(y, comm, 0)

    args = inputs([(S, H), (E * R, H), (E * R, H, FF), (E * R, FF, H)], seed=3)
    with torch.no_grad():
        torch.testing.assert_close(f(*args), moe_reference(*args, topk), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(f, args)


def test_layer_step_matches_single_process(ctx, comm):
    """Forward and backward on every rank's tokens: the output, the input's
    gradient and every weight's gradient against the single-process loop
    (the router's summed over the ranks by allreduce_replicated_grads)."""
    R, p, E, H, FF, topk = comm.size, comm.rank, 2, 6, 8, 2
    S = 4 * R + 1
    rows = uneven(S, R)
    torch.manual_seed(11)
    layer = ExpertParallelMLP(ctx, H, FF, E, topk=topk, strategy="pairwise", dtype=torch.float64)
    router = layer.router.detach().clone().requires_grad_()
    w1 = torch.cat(comm.allgather(layer.w1.detach())).requires_grad_()
    w2 = torch.cat(comm.allgather(layer.w2.detach())).requires_grad_()
    x = torch.from_numpy(rng_for(5).standard_normal((S, H))).requires_grad_()
    dy = torch.from_numpy(rng_for(6).standard_normal((S, H)))
    moe_reference(x, router, w1, w2, topk).backward(dy)

    mine = part(x.detach(), rows, p, 0).clone().requires_grad_()
    y = layer(mine)
    y.backward(part(dy, rows, p, 0))
    allreduce_replicated_grads(layer.parameters(), ctx)
    tol = dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.cat(comm.allgather(y.detach())), moe_reference(x.detach(), router.detach(),
                                                                                    w1.detach(), w2.detach(), topk),
                               **tol)
    torch.testing.assert_close(mine.grad, part(x.grad, rows, p, 0), **tol)
    torch.testing.assert_close(layer.router.grad, router.grad, **tol)
    torch.testing.assert_close(layer.w1.grad, w1.grad[p * E:(p + 1) * E], **tol)
    torch.testing.assert_close(layer.w2.grad, w2.grad[p * E:(p + 1) * E], **tol)
    assert sum(comm.allgather(sum(layer.load))) == S * topk  # no token dropped
