"""overlap.torch.DistributedDataParallel against torch's own
DistributedDataParallel on gloo: the same gradients after each backward and
the same weights after two optimizer steps, for a plain model (float64 and
float32, with the rings on a thread and without), for a model with
parameters some ranks or no rank used, for a tensor-parallel model (tp 2 x
dp size/2 where the size is even), and across no_sync. Buckets of about
1 KB, so that there are several, split unevenly over the ranks. Bad input
raises on every rank."""

import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch import nn

import overlap
from overlap.torch import DistributedDataParallel, parallelize

H, FFN, ROWS = 6, 20, 5


@pytest.fixture(scope="module")
def gloo(comm):
    """torch.distributed on gloo over loopback, for torch's DDP."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size,
                            timeout=timedelta(seconds=120))
    yield dist.group.WORLD
    dist.destroy_process_group()


class Net(nn.Module):
    """Two MLP blocks and a head; `extra` is used where use_extra, `never`
    never."""

    def __init__(self, seed, dtype=torch.float64):
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(H, FFN), nn.GELU(), nn.Linear(FFN, H))
                                     for _ in range(2)])
        self.norm = nn.LayerNorm(H)
        self.head = nn.Linear(H, 3)
        self.extra = nn.Linear(3, 3)
        self.never = nn.Linear(3, 3)
        self.use_extra = False
        self.to(dtype)

    def forward(self, x):
        for blk in self.blocks:
            x = x + blk(x)
        y = self.head(self.norm(x))
        return self.extra(y) if self.use_extra else y


def batch(rank, step, dtype):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(ROWS, H, generator=g).to(dtype), torch.randn(ROWS, 3, generator=g).to(dtype)


def run(model, rank, dtype, steps=2, sync=None):
    """Steps of SGD with momentum; returns [(loss, {name: grad or None})] per step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    seen = []
    for step in range(steps):
        x, t = batch(rank, step, dtype)
        opt.zero_grad(set_to_none=True)
        if sync is not None:  # one backward without the sum first: the gradients accumulate
            with model.no_sync():
                ((model(x * 0.5) - t) ** 2).mean().backward()
        loss = ((model(x) - t) ** 2).mean()
        loss.backward()
        seen.append((loss.item(), {n: None if p.grad is None else p.grad.clone()
                                   for n, p in model.module.named_parameters()}))
        if isinstance(model, DistributedDataParallel):  # every bucket left during the backward, unused or not
            assert model.queued_in_backward == len(model._buckets)
        opt.step()
    return seen


def assert_same(ours, theirs, dtype):
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == torch.float64 else dict(rtol=2e-5, atol=1e-6)
    for (loss, grads), (their_loss, their_grads) in zip(ours, theirs):
        assert loss == pytest.approx(their_loss, rel=tol["rtol"] * 100)
        assert list(grads) == list(their_grads)
        for n, g in grads.items():
            assert (g is None) == (their_grads[n] is None), n
            if g is not None:
                torch.testing.assert_close(g, their_grads[n], **tol, msg=n)


@pytest.mark.parametrize("thread", [True, False], ids=["thread", "hooks"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_gradients_match_torch_ddp(comm, gloo, dtype, thread):
    # Every rank starts from its own weights: both wrappers make them rank 0's.
    theirs = nn.parallel.DistributedDataParallel(Net(comm.rank, dtype), bucket_cap_mb=0.0004,
                                                 find_unused_parameters=True)
    ours = DistributedDataParallel(Net(comm.rank, dtype), comm, bucket_cap_mb=0.0004, thread=thread)
    assert len(ours._buckets) >= 4
    if not thread:
        assert not ours.threaded
    assert_same(run(ours, comm.rank, dtype), run(theirs, comm.rank, dtype), dtype)
    for (n, a), (_, b) in zip(ours.module.state_dict().items(), theirs.module.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-10 if dtype == torch.float64 else 1e-5, atol=1e-12, msg=n)
    ours.close()


def test_unused_parameters_match_torch_ddp(comm, gloo):
    """`extra` has gradients on rank 0 only (averaged over every rank, the
    others counting zero); `never` on no rank (its .grad stays None)."""
    theirs_net, ours_net = Net(3), Net(3)
    theirs_net.use_extra = ours_net.use_extra = comm.rank == 0
    theirs = nn.parallel.DistributedDataParallel(theirs_net, bucket_cap_mb=0.0004, find_unused_parameters=True)
    ours = DistributedDataParallel(ours_net, comm, bucket_cap_mb=0.0004)
    mine, reference = run(ours, comm.rank, torch.float64), run(theirs, comm.rank, torch.float64)
    assert mine[0][1]["never.weight"] is None
    assert mine[0][1]["extra.weight"] is not None
    assert_same(mine, reference, torch.float64)
    ours.close()


def test_no_sync_matches_torch_ddp(comm, gloo):
    theirs = nn.parallel.DistributedDataParallel(Net(4), bucket_cap_mb=0.0004, find_unused_parameters=True)
    ours = DistributedDataParallel(Net(4), comm, bucket_cap_mb=0.0004)
    assert_same(run(ours, comm.rank, torch.float64, sync=False), run(theirs, comm.rank, torch.float64, sync=False),
                torch.float64)
    ours.close()


class TensorParallelNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.up, self.down = nn.Linear(H, FFN), nn.Linear(FFN, H)
        self.double()

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def test_tensor_parallel_model_matches_torch_ddp(comm, gloo):
    """tp 2 (where the size is even) x dp: each tensor group's shards are
    averaged over the ranks holding the same shards."""
    tp = 2 if comm.size % 2 == 0 else 1
    tp_comm, dp_comm = comm.Split(comm.rank // tp, comm.rank), comm.Split(comm.rank % tp, comm.rank)
    groups = [dist.new_group([r for r in range(comm.size) if r % tp == c]) for c in range(tp)]  # every rank makes all
    with overlap.Context(tp_comm) as ctx:
        models = []
        for _ in range(2):
            m = TensorParallelNet()
            parallelize(m, ctx, {"up": "column", "down": "row"}, sequence_parallel=False, strategy="ring")
            models.append(m)
        theirs = nn.parallel.DistributedDataParallel(models[0], process_group=groups[comm.rank % tp],
                                                     bucket_cap_mb=0.0005)
        ours = DistributedDataParallel(models[1], dp_comm, bucket_cap_mb=0.0005)
        dp_rank = dp_comm.rank

        def step(model):
            opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
            seen = []
            for s in range(2):
                x, t = batch(dp_rank, s, torch.float64)
                t = torch.cat([t, t], 1)[:, :H]
                opt.zero_grad(set_to_none=True)
                loss = ((model(x) - t) ** 2).mean()
                loss.backward()
                seen.append((loss.item(), {n: p.grad.clone() for n, p in model.module.named_parameters()}))
                opt.step()
            return seen

        assert_same(step(ours), step(theirs), torch.float64)
        ours.close()
    for g in groups:
        dist.destroy_process_group(g)
    tp_comm.Free()
    dp_comm.Free()


def test_bad_input_raises_on_every_rank(comm):
    odd = Net(0)
    if comm.rank == comm.size - 1:
        odd.head = nn.Linear(H, 4).double()
    if comm.size > 1:
        with pytest.raises(ValueError, match=f"rank {comm.size - 1}'s parameters or buffers"):
            DistributedDataParallel(odd, comm)
    frozen = Net(0)
    if comm.rank == comm.size - 1:
        frozen.head.bias.requires_grad_(False)
    if comm.size > 1:
        with pytest.raises(ValueError, match="requires_grad"):
            DistributedDataParallel(frozen, comm)
    half = Net(0)
    if comm.rank == 0:
        half.head.half()
    with pytest.raises(TypeError, match="rank 0: a parameter is torch.float16"):
        DistributedDataParallel(half, comm)
    with pytest.raises(ValueError, match="bucket_cap_mb=0 must be > 0"):
        DistributedDataParallel(Net(0), comm, bucket_cap_mb=0)
    if comm.size > 1:
        with pytest.raises(ValueError, match="rank 1's bucket_cap_mb"):
            DistributedDataParallel(Net(0), comm, bucket_cap_mb=1 + comm.rank)
    with pytest.raises(ValueError):  # a setting of the context it opens
        DistributedDataParallel(Net(0), comm, timeout_s=-1)
    comm.Barrier()
    assert MPI.Is_initialized()
