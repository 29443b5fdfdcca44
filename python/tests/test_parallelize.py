"""overlap.torch.parallelize on a plain two-block transformer: the loss, the
gradients and the weights after two optimizer steps match the same model
unparallelized on one process (float64), with sequence parallelism and
without, with separate and fused QKV projections and a fused activation;
gather_state_dict round-trips; bad plans and disagreeing ranks raise on
every rank. Shards are uneven (7 rows, 3 heads, an MLP of 36 features) and
at 4 ranks a rank holds no head."""

import math

import pytest
import torch
from torch import nn

import overlap.torch as otorch
from overlap.torch import (ColumnParallelLinear, RowParallelLinear, gather_grads, gather_state_dict, parallelize,
                           sequence_slice, transformer_plan)

H, HEADS, FFN, SEQ, BATCH = 6, 3, 36, 7, 2


class Attention(nn.Module):
    def __init__(self, fused):
        super().__init__()
        self.head_dim, self.fused = H // HEADS, fused
        if fused:
            self.qkv = nn.Linear(H, 3 * H)
        else:
            self.q, self.k, self.v = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
        self.out = nn.Linear(H, H)

    def forward(self, y):  # y: (seq, batch, H); the projections hold every row
        q, k, v = self.qkv(y).chunk(3, -1) if self.fused else (self.q(y), self.k(y), self.v(y))
        s, b, width = q.shape
        heads = width // self.head_dim  # this rank's heads once parallelized

        def split(t):
            return t.reshape(s, b, heads, self.head_dim).permute(1, 2, 0, 3)

        scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(self.head_dim)
        o = torch.softmax(scores, -1) @ split(v)
        return self.out(o.permute(2, 0, 1, 3).reshape(s, b, width))


class Block(nn.Module):
    def __init__(self, fused):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.attn = Attention(fused)
        self.mlp = nn.Sequential(nn.Linear(H, FFN), nn.GELU(), nn.Linear(FFN, H))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Model(nn.Module):
    def __init__(self, fused=False, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList([Block(fused) for _ in range(2)])
        self.head = nn.Linear(H, 3)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    return (torch.randn(SEQ, BATCH, H, generator=g, dtype=torch.float64),
            torch.randn(SEQ, BATCH, 3, generator=g, dtype=torch.float64))


def plan_of(fused, fused_gelu):
    plan = transformer_plan("blocks.*", H // HEADS, q=None if fused else "attn.q", k=None if fused else "attn.k",
                            v=None if fused else "attn.v", qkv="attn.qkv" if fused else None, out="attn.out",
                            up="mlp.0", down="mlp.2", activation="gelu" if fused_gelu else None)
    return plan


def train(model, ctx, sp, steps=2):
    """Two SGD steps; returns each step's loss (summed over the ranks' rows
    under sequence parallelism)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        x, t = data(step)
        mine = sequence_slice(SEQ, ctx) if sp else slice(None)
        out = model(x[mine])
        loss = ((out - t[mine]) ** 2).sum() / t.numel()
        opt.zero_grad()
        loss.backward()
        otorch.allreduce_replicated_grads(model.parameters(), ctx)
        losses.append(ctx.comm.allreduce(loss.item()) if sp else loss.item())
        last_grads = gather_grads(model, ctx)
        opt.step()
    return losses, last_grads


def reference(fused, steps=2):
    model = Model(fused).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        x, t = data(step)
        loss = ((model(x) - t) ** 2).sum() / t.numel()
        opt.zero_grad()
        loss.backward()
        losses.append(loss.item())
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    return model, losses, grads


@pytest.mark.parametrize("sp", [True, False], ids=["sequence_parallel", "replicated_rows"])
@pytest.mark.parametrize("fused", [False, True], ids=["q_k_v", "fused_qkv"])
def test_matches_the_unparallelized_model(ctx, comm, sp, fused):
    ref, ref_losses, ref_grads = reference(fused)
    model = Model(fused).double()
    parallelize(model, ctx, plan_of(fused, False), sequence_parallel=sp, strategy="ring")
    losses, grads = train(model, ctx, sp)
    state = gather_state_dict(model, ctx)
    if comm.rank == 0:
        assert losses == pytest.approx(ref_losses, rel=1e-10)
        assert list(grads) == list(ref_grads)
        for n, g in grads.items():
            assert torch.allclose(g, ref_grads[n], rtol=1e-9, atol=1e-12), n
        assert list(state) == list(ref.state_dict())
        for n, w in ref.state_dict().items():
            assert torch.allclose(state[n], w, rtol=1e-9, atol=1e-12), n


def test_fused_activation_matches(ctx, comm):
    """The MLP's GELU fused into the up-projection (the model's own GELU
    removed): the same training as the unparallelized model."""
    ref, ref_losses, _ = reference(False)
    model = Model(False).double()
    for blk in model.blocks:
        blk.mlp[1] = nn.Identity()
    parallelize(model, ctx, plan_of(False, True), strategy="ring")
    assert model.blocks[0].mlp[0].activation == "gelu"
    losses, _ = train(model, ctx, True)
    state = gather_state_dict(model, ctx)
    if comm.rank == 0:
        assert losses == pytest.approx(ref_losses, rel=1e-10)
        for n, w in ref.state_dict().items():
            assert torch.allclose(state[n], w, rtol=1e-9, atol=1e-12), n


def test_names_shapes_and_marks(ctx):
    model = Model().double()
    names = [n for n, _ in model.named_parameters()]
    parallelize(model, ctx, plan_of(False, False))
    assert [n for n, _ in model.named_parameters()] == names  # nn.Linear's names kept
    q, out, up = model.blocks[0].attn.q, model.blocks[0].attn.out, model.blocks[0].mlp[0]
    assert isinstance(q, ColumnParallelLinear) and isinstance(out, RowParallelLinear)
    heads = otorch.even_split(HEADS, ctx.size)[ctx.rank]
    assert q.weight.shape == (heads * 2, H) and q.out_features == heads * 2 and q.bias.shape == (heads * 2,)
    assert out.weight.shape == (H, heads * 2) and out.in_features == heads * 2
    assert up.weight.shape == (otorch.even_split(FFN, ctx.size)[ctx.rank], H)
    split = {id(getattr(m, n)) for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))
             for n, _ in m.sharded()}
    assert len(split) == 2 * (4 * 2 + 2 * 2 - 2)  # per block: q, k, v, up (weight, bias), out and down (weight)
    for p in model.parameters():  # everything not split is summed by allreduce_replicated_grads
        assert getattr(p, "sequence_parallel", False) == (id(p) not in split)
    assert out.bias.sequence_parallel


def test_state_dict_round_trips(ctx, comm):
    """gather_state_dict after training loads into a fresh plain model whose
    parallelize gives every rank the same blocks again."""
    model = Model(True).double()
    parallelize(model, ctx, plan_of(True, False), strategy="bulk")
    train(model, ctx, True, steps=1)
    state = comm.bcast(gather_state_dict(model, ctx), root=0)
    fresh = Model(True, seed=5).double()
    fresh.load_state_dict(state)
    parallelize(fresh, ctx, plan_of(True, False), strategy="bulk")
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), n


def test_bad_plans_raise_on_every_rank(ctx):
    with pytest.raises(ValueError, match="names no module"):
        parallelize(Model(), ctx, {"blocks.*.nothing": "column"})
    with pytest.raises(ValueError, match="not an nn.Linear"):
        parallelize(Model(), ctx, {"blocks.0.ln1": "column"})
    with pytest.raises(ValueError, match="must be 'column', 'row'"):
        parallelize(Model(), ctx, {"head": "diagonal"})
    with pytest.raises(ValueError, match="not a multiple"):
        parallelize(Model(), ctx, {"head": {"style": "column", "unit": 2}})
    tied = Model()
    tied.blocks[1].attn.q.weight = tied.blocks[0].attn.q.weight
    with pytest.raises(ValueError, match="tied"):
        parallelize(tied, ctx, {"blocks.0.attn.q": "column"})


def test_weights_that_differ_raise_on_every_rank(ctx, comm):
    model = Model(seed=comm.rank)  # rank 0's weights differ from every other rank's
    if comm.size == 1:
        assert parallelize(model, ctx, {"blocks.0.mlp.0": "column"}) is model
        return
    with pytest.raises(ValueError, match="rank 1 differs from rank 0: the weights of 'blocks.0.mlp.0'"):
        parallelize(model, ctx, {"blocks.0.mlp.0": "column"})


def test_layers_start_as_nn_linear(ctx, comm):
    """With every rank seeded alike, the blocks of a column and a row layer
    are those of nn.Linear's initialisation of the whole layer."""
    sizes = otorch.even_split(10, comm.size)
    torch.manual_seed(7)
    col = ColumnParallelLinear(ctx, 4, sizes[comm.rank])
    row = RowParallelLinear(ctx, sizes[comm.rank], 3)
    torch.manual_seed(7)
    whole_col, whole_row = nn.Linear(4, 10), nn.Linear(10, 3)
    lo = sum(sizes[:comm.rank])
    assert torch.equal(col.weight, whole_col.weight[lo:lo + sizes[comm.rank]])
    assert torch.equal(col.bias, whole_col.bias[lo:lo + sizes[comm.rank]])
    assert torch.equal(row.weight, whole_row.weight[:, lo:lo + sizes[comm.rank]])
    assert torch.equal(row.bias, whole_row.bias)
