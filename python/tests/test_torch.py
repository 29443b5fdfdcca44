"""overlap.torch's layers: torch.autograd.gradcheck in float64 of each
layer kind, and their outputs against plain torch on the gathered data.

gradcheck perturbs every rank's inputs at once, so each layer is checked as
a function of replicated whole inputs that every rank slices its shard
from (the slices' gradients summed over the ranks), with its sharded output
gathered back to whole on every rank: one function, the same on every rank,
whose true Jacobian the analytical one must match."""

import numpy as np
import torch
from mpi4py import MPI

from overlap.torch import ColumnParallelLinear, RowParallelLinear, allreduce_replicated_grads, even_split


class _Replicated(torch.autograd.Function):
    """Identity forward; the gradient summed over the ranks."""

    @staticmethod
    def forward(fctx, x, comm):
        fctx.comm = comm
        return x.clone()

    @staticmethod
    def backward(fctx, g):
        out = np.empty(g.shape)
        fctx.comm.Allreduce(np.ascontiguousarray(g.numpy()), out, op=MPI.SUM)
        return torch.from_numpy(out), None


class _Gathered(torch.autograd.Function):
    """Every rank's x concatenated along dim; backward: this rank's part."""

    @staticmethod
    def forward(fctx, x, comm, dim):
        parts = comm.allgather(x.detach().numpy())
        fctx.dim, fctx.sizes, fctx.rank = dim, [p.shape[dim] for p in parts], comm.rank
        return torch.from_numpy(np.concatenate(parts, dim))

    @staticmethod
    def backward(fctx, g):
        lo = sum(fctx.sizes[:fctx.rank])
        return g.narrow(fctx.dim, lo, fctx.sizes[fctx.rank]), None, None


def part(t, sizes, rank, dim):
    return t.narrow(dim, sum(sizes[:rank]), sizes[rank])


def uneven(total, ranks):
    """Uneven shards with rank 1 empty at 3 ranks or more."""
    sizes = even_split(total, ranks)
    if ranks >= 3:
        sizes[0] += sizes[1]
        sizes[1] = 0
    return sizes


def inputs(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes]


def test_column_gradcheck(ctx, comm):
    S, H, O = 5, 3, 4 * comm.size - 1
    rows, cols = uneven(S, comm.size), uneven(O, comm.size)  # an empty shard of rows and of features at 3 ranks
    layer = ColumnParallelLinear(ctx, H, cols[comm.rank], strategy="ring", dtype=torch.float64)

    def f(x, w, b):
        x, w, b = (_Replicated.apply(t, comm) for t in (x, w, b))
        params = {"weight": part(w, cols, comm.rank, 0), "bias": part(b, cols, comm.rank, 0)}
        y = torch.nn.utils.stateless.functional_call(layer, params, (part(x, rows, comm.rank, 0),))
        return _Gathered.apply(y, comm, 1)

    assert torch.autograd.gradcheck(f, inputs([(S, H), (O, H), (O,)]))


def test_fused_column_gradcheck(ctx, comm):
    S, H, O = 4, 3, 2 * comm.size + 1
    rows, cols = uneven(S, comm.size), even_split(O, comm.size)
    layer = ColumnParallelLinear(ctx, H, [cols[comm.rank]] * 2, strategy="ring", dtype=torch.float64)

    def f(x, w1, b1, w2, b2):
        x, w1, b1, w2, b2 = (_Replicated.apply(t, comm) for t in (x, w1, b1, w2, b2))
        params = {"weights.0": part(w1, cols, comm.rank, 0), "biases.0": part(b1, cols, comm.rank, 0),
                  "weights.1": part(w2, cols, comm.rank, 0), "biases.1": part(b2, cols, comm.rank, 0)}
        y1, y2 = torch.nn.utils.stateless.functional_call(layer, params, (part(x, rows, comm.rank, 0),))
        return _Gathered.apply(y1, comm, 1), _Gathered.apply(y2, comm, 1)

    assert torch.autograd.gradcheck(f, inputs([(S, H), (O, H), (O,), (O, H), (O,)], seed=1))


def test_fused_column_of_one_weight_gradcheck(ctx, comm):
    """A list of one weight: the fused backward passes the one gradient and
    weight through rather than concatenating them."""
    S, H, O = 5, 3, 3 * comm.size - 1
    rows, cols = uneven(S, comm.size), uneven(O, comm.size)
    layer = ColumnParallelLinear(ctx, H, [cols[comm.rank]], strategy="ring", dtype=torch.float64)

    def f(x, w, b):
        x, w, b = (_Replicated.apply(t, comm) for t in (x, w, b))
        params = {"weights.0": part(w, cols, comm.rank, 0), "biases.0": part(b, cols, comm.rank, 0)}
        (y,) = torch.nn.utils.stateless.functional_call(layer, params, (part(x, rows, comm.rank, 0),))
        return _Gathered.apply(y, comm, 1)

    assert torch.autograd.gradcheck(f, inputs([(S, H), (O, H), (O,)], seed=5))


def test_row_gradcheck(ctx, comm):
    S, I, O = 2 * comm.size + 1, 3 * comm.size - 1, 3
    rows, feats = uneven(S, comm.size), even_split(I, comm.size)
    layer = RowParallelLinear(ctx, feats[comm.rank], O, strategy="ring", dtype=torch.float64)

    def f(y, w, b):
        y, w = _Replicated.apply(y, comm), _Replicated.apply(w, comm)
        # The bias is whole on every rank: its partial gradients are summed
        # by allreduce_replicated_grads in training, by _Replicated here.
        b = _Replicated.apply(b, comm)
        params = {"weight": part(w, feats, comm.rank, 1), "bias": b}
        z = torch.nn.utils.stateless.functional_call(layer, params, (part(y, feats, comm.rank, 1), rows[comm.rank]))
        return _Gathered.apply(z, comm, 0)

    assert torch.autograd.gradcheck(f, inputs([(S, I), (O, I), (O,)], seed=2))


def test_layers_match_torch_in_bf16(ctx, comm):
    """A column then a row layer in bfloat16 against torch's float64 on the
    same values, forward and the input's gradient; and the replicated
    bias's gradient summed by allreduce_replicated_grads."""
    S, H, F = 6, 8, 4 * comm.size
    rows, feats = even_split(S, comm.size), even_split(F, comm.size)
    g = torch.Generator().manual_seed(3)
    x, w1, w2 = (torch.randn(*s, generator=g) for s in ((S, H), (F, H), (H, F)))
    col = ColumnParallelLinear(ctx, H, feats[comm.rank], bias=False, strategy="ring", dtype=torch.bfloat16)
    row = RowParallelLinear(ctx, feats[comm.rank], H, strategy="ring", dtype=torch.bfloat16)
    with torch.no_grad():
        col.weight.copy_(part(w1, feats, comm.rank, 0))
        row.weight.copy_(part(w2, feats, comm.rank, 1))
    xs = part(x, rows, comm.rank, 0).to(torch.bfloat16).requires_grad_()
    z = row(col(xs))
    z.float().sum().backward()
    allreduce_replicated_grads(row.parameters(), comm)
    xr = x.double().requires_grad_()
    ref = (xr @ w1.double().t()) @ w2.double().t()
    ref.sum().backward()
    tol = 0.05 * ref.abs().max().item()
    assert (z.double() - part(ref, rows, comm.rank, 0)).abs().max().item() <= tol
    assert (xs.grad.double() - part(xr.grad, rows, comm.rank, 0)).abs().max().item() <= 0.05 * xr.grad.abs().max()
    assert torch.allclose(row.bias.grad.double(), torch.full((H,), float(S), dtype=torch.float64))


def test_column_without_sequence_parallelism_gradcheck(ctx, comm):
    """Every rank holds all of x: its gradient is all-reduced by the layer,
    so x is not summed again here, while each rank's part of the weights and
    biases is."""
    S, H, O = 5, 3, 4 * comm.size - 1
    cols = uneven(O, comm.size)
    single = ColumnParallelLinear(ctx, H, cols[comm.rank], strategy="ring", dtype=torch.float64,
                                  sequence_parallel=False)
    fused = ColumnParallelLinear(ctx, H, [cols[comm.rank]] * 2, strategy="ring", dtype=torch.float64,
                                 sequence_parallel=False)

    def f(x, w1, b1, w2, b2):
        w1, b1, w2, b2 = (_Replicated.apply(t, comm) for t in (w1, b1, w2, b2))
        p1, q1 = part(w1, cols, comm.rank, 0), part(b1, cols, comm.rank, 0)
        p2, q2 = part(w2, cols, comm.rank, 0), part(b2, cols, comm.rank, 0)
        y = torch.nn.utils.stateless.functional_call(single, {"weight": p1, "bias": q1}, (x,))
        y1, y2 = torch.nn.utils.stateless.functional_call(
            fused, {"weights.0": p1, "biases.0": q1, "weights.1": p2, "biases.1": q2}, (x,))
        return _Gathered.apply(y, comm, 1), _Gathered.apply(y1 + y2, comm, 1)

    assert torch.autograd.gradcheck(f, inputs([(S, H), (O, H), (O,), (O, H), (O,)], seed=4))


def test_row_without_sequence_parallelism_gradcheck(ctx, comm):
    """The output is whole on every rank, and so is the bias's gradient:
    only the parts of y and w are summed over the ranks here."""
    S, I, O = 2 * comm.size + 1, 3 * comm.size - 1, 3
    feats = uneven(I, comm.size)
    layer = RowParallelLinear(ctx, feats[comm.rank], O, strategy="ring", dtype=torch.float64, sequence_parallel=False)
    assert not getattr(layer.bias, "sequence_parallel", False)

    def f(y, w, b):
        y, w = _Replicated.apply(y, comm), _Replicated.apply(w, comm)
        params = {"weight": part(w, feats, comm.rank, 1), "bias": b}
        return torch.nn.utils.stateless.functional_call(layer, params, (part(y, feats, comm.rank, 1),))

    assert torch.autograd.gradcheck(f, inputs([(S, I), (O, I), (O,)], seed=5))


def test_fused_activations_gradcheck(ctx, comm):
    """activation= fused into the ops: a column layer with GELU and one with
    ReLU feeding a row layer with GELU (sequence parallel), and a row layer
    with ReLU without it."""
    S, H, F_, O = 5, 3, 3 * comm.size + 1, 2
    rows, feats = uneven(S, comm.size), uneven(F_, comm.size)
    gelu = ColumnParallelLinear(ctx, H, feats[comm.rank], strategy="ring", dtype=torch.float64, activation="gelu")
    relu = ColumnParallelLinear(ctx, H, feats[comm.rank], strategy="ring", dtype=torch.float64, activation="relu")
    row = RowParallelLinear(ctx, feats[comm.rank], O, strategy="ring", dtype=torch.float64, activation="gelu")
    whole = RowParallelLinear(ctx, feats[comm.rank], O, strategy="ring", dtype=torch.float64, activation="relu",
                              sequence_parallel=False)

    def f(x, w1, b1, w2, b2, w3, b3, b4):
        # b4, the bias of the row layer without sequence parallelism, gets its
        # whole gradient on every rank: it is not summed.
        x, w1, b1, w2, b2, w3, b3 = (_Replicated.apply(t, comm) for t in (x, w1, b1, w2, b2, w3, b3))
        xs = part(x, rows, comm.rank, 0)
        h1 = torch.nn.utils.stateless.functional_call(
            gelu, {"weight": part(w1, feats, comm.rank, 0), "bias": part(b1, feats, comm.rank, 0)}, (xs,))
        h2 = torch.nn.utils.stateless.functional_call(
            relu, {"weight": part(w2, feats, comm.rank, 0), "bias": part(b2, feats, comm.rank, 0)}, (xs,))
        z = torch.nn.utils.stateless.functional_call(
            row, {"weight": part(w3, feats, comm.rank, 1), "bias": b3}, (h1 + h2, rows[comm.rank]))
        zw = torch.nn.utils.stateless.functional_call(
            whole, {"weight": part(w3, feats, comm.rank, 1), "bias": b4}, (h1 - h2,))
        return _Gathered.apply(z, comm, 0), zw

    args = inputs([(S, H), (F_, H), (F_,), (F_, H), (F_,), (O, F_), (O,), (O,)], seed=6)
    assert torch.autograd.gradcheck(f, args)


def test_fused_gelu_without_gradients_matches(ctx, comm):
    """Without a gradient to compute (torch.no_grad) GELU runs in the op's
    epilogue; with one the op fuses the bias and the layer keeps the product:
    the same outputs."""
    rows, feats = even_split(6, comm.size), even_split(4 * comm.size, comm.size)
    torch.manual_seed(9)
    col = ColumnParallelLinear(ctx, 8, feats[comm.rank], strategy="ring", activation="gelu")
    row = RowParallelLinear(ctx, feats[comm.rank], 8, strategy="ring", activation="gelu")
    x = torch.randn(rows[comm.rank], 8)
    trained = row(col(x))
    with torch.no_grad():
        inferred = row(col(x))
    assert torch.allclose(trained, inferred, rtol=1e-5, atol=1e-6)
    plain = ColumnParallelLinear(ctx, 8, feats[comm.rank], strategy="ring")
    with torch.no_grad():
        plain.weight.copy_(col.weight)
        plain.bias.copy_(col.bias)
        assert torch.allclose(col(x), torch.nn.functional.gelu(plain(x)), rtol=1e-5, atol=1e-6)
