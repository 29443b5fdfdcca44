#!/usr/bin/env python3
"""Trains a small mixture-of-experts model with expert parallelism, bulk
against pairwise, and checks its loss curve against the same model in plain
single-process PyTorch.

    mpirun -n 4 python3 python/examples/train_moe.py --steps 20 --strategy bulk pairwise --check

The model: y = head(x + moe(norm(x))), where moe is an
overlap.torch.ExpertParallelMLP (``--experts-per-rank`` experts on each
rank, top-``--topk`` routing, GELU experts of inner width ``--ffn``). It
learns a synthetic regression whose target mixes several nonlinear maps of
the input (so that experts have something to specialise in), with SGD and
momentum. Each rank takes its ``--tokens`` rows of every batch; the router,
the layer norm and the head are whole on every rank, their gradients summed
over the ranks (allreduce_replicated_grads); the experts' are complete.

Every rank trains one model per strategy, from the same initial weights on
the same data, their steps interleaved. Prints each strategy's median step
time (the slowest rank's) and the speedup over bulk; --json FILE appends one
JSON object per strategy; --check trains the whole model on rank 0 alone
(every token, every expert, in plain torch) and fails when a loss differs by
more than --tolerance (relative).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn

import overlap
from overlap.torch import ExpertParallelMLP, allreduce_replicated_grads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_gpt import compare, provenance  # noqa: E402


def args_of(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per strategy")
    p.add_argument("--strategy", nargs="+", default=["bulk", "pairwise"], choices=["bulk", "pairwise", "automatic"],
                   help="strategies to train, one model each, steps interleaved")
    p.add_argument("--width", type=int, default=256, help="model width")
    p.add_argument("--ffn", type=int, default=1024, help="an expert's inner width")
    p.add_argument("--experts-per-rank", type=int, default=2)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--tokens", type=int, default=512, help="token rows per rank in each batch")
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: torch's default)")
    p.add_argument("--json", help="append one JSON object per strategy to this file")
    p.add_argument("--check", action="store_true", help="compare the losses with single-process PyTorch")
    p.add_argument("--tolerance", type=float, default=2e-3, help="--check: largest relative loss difference")
    return p.parse_args(argv)


def batch_of(step, a, ranks):
    """(inputs, targets) of every rank's tokens, the same on every rank."""
    g = torch.Generator().manual_seed(a.seed * 1000 + step)
    maps = torch.Generator().manual_seed(a.seed)
    mix = torch.randn(4, a.width, a.width, generator=maps) / a.width ** 0.5
    x = torch.randn(ranks * a.tokens, a.width, generator=g)
    which = (x[:, 0] > 0).long() * 2 + (x[:, 1] > 0).long()  # one map per quadrant of two features
    y = torch.tanh(torch.einsum("ti,tio->to", x, mix[which]))
    return x, y


class Model(nn.Module):
    """head(x + moe(norm(x))), with the experts spread over ctx's ranks."""

    def __init__(self, ctx, a, strategy, dtype):
        super().__init__()
        self.norm = nn.LayerNorm(a.width, dtype=dtype)
        self.moe = ExpertParallelMLP(ctx, a.width, a.ffn, a.experts_per_rank, topk=a.topk, strategy=strategy,
                                     dtype=dtype)
        self.head = nn.Linear(a.width, a.width, dtype=dtype)
        for p in [*self.norm.parameters(), *self.head.parameters()]:
            p.sequence_parallel = True  # whole on every rank: partial gradients, summed

    def forward(self, x):
        return self.head(x + self.moe(self.norm(x)))


class Reference(nn.Module):
    """The same model on one process: every expert, every token, plain torch."""

    def __init__(self, model, w1, w2, topk):
        super().__init__()
        self.norm = nn.LayerNorm(model.norm.normalized_shape, dtype=w1.dtype)
        self.head = nn.Linear(model.head.in_features, model.head.out_features, dtype=w1.dtype)
        self.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("moe.")},
                             strict=False)
        self.router = nn.Parameter(model.moe.router.detach().clone())
        self.w1, self.w2, self.topk = nn.Parameter(w1), nn.Parameter(w2), topk

    def forward(self, x):
        n = self.norm(x)
        chosen, experts = n.mm(self.router.t()).topk(self.topk, dim=1)
        gates = F.softmax(chosen, dim=1)
        out = torch.zeros_like(x)
        for e in range(self.w1.shape[0]):
            token, slot = (experts == e).nonzero(as_tuple=True)
            if token.numel():
                y = F.gelu(n[token] @ self.w1[e]) @ self.w2[e]
                out = out.index_add(0, token, y * gates[token, slot].unsqueeze(1))
        return self.head(x + out)


def step(model, opt, x, y, total, comm):
    """One optimizer step on this rank's rows; the loss of every rank's rows."""
    loss = F.mse_loss(model(x), y, reduction="sum") / (total * y.shape[1])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    allreduce_replicated_grads(model.parameters(), comm)
    opt.step()
    return comm.allreduce(loss.item(), op=MPI.SUM)


def train(ctx, comm, a, strategies, dtype):
    """One model per strategy from the same weights, steps interleaved.
    Returns each strategy's losses and step times (the slowest rank's), and
    the initial whole experts (for the reference)."""
    models = {}
    for s in strategies:
        torch.manual_seed(a.seed)
        models[s] = Model(ctx, a, s, dtype)
    first = models[strategies[0]]
    w1 = torch.cat(comm.allgather(first.moe.w1.detach()))
    w2 = torch.cat(comm.allgather(first.moe.w2.detach()))
    init = (Reference(first, w1, w2, a.topk) if comm.rank == 0 else None)
    opts = {s: torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9) for s, m in models.items()}
    losses, times = {s: [] for s in strategies}, {s: [] for s in strategies}
    mine = slice(comm.rank * a.tokens, (comm.rank + 1) * a.tokens)
    for i in range(a.steps):
        x, y = batch_of(i, a, comm.size)
        for s, model in models.items():
            comm.Barrier()
            t0 = time.perf_counter()
            losses[s].append(step(model, opts[s], x[mine].to(dtype), y[mine].to(dtype), len(x), comm))
            times[s].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return losses, times, init


def train_reference(model, a, ranks, dtype):
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    losses = []
    for i in range(a.steps):
        x, y = batch_of(i, a, ranks)
        loss = F.mse_loss(model(x.to(dtype)), y.to(dtype))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def report(a, comm, results, ref):
    """Rank 0: the times, the speedups, the parity check (train_gpt.compare) and the JSON rows; the exit status."""
    for s, (losses, ms) in results.items():
        print(f"{s:>9}: step {ms:9.2f} ms (median, slowest rank), loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    worst, status = compare(results, ref, a)
    if a.json:
        with open(a.json, "a") as f:
            for s, (losses, ms) in results.items():
                f.write(json.dumps({
                    "example": "train_moe", "strategy": s, "ranks": comm.size, "step_ms": ms,
                    "final_loss": losses[-1], "losses": losses, "reference_losses": ref,
                    "max_rel_loss_diff": worst, "steps": a.steps, "width": a.width, "ffn": a.ffn,
                    "experts": a.experts_per_rank * comm.size, "topk": a.topk, "tokens_per_rank": a.tokens,
                    "dtype": a.dtype, **provenance(),
                }) + "\n")
    return status


def main(argv=None):
    a = args_of(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    comm = MPI.COMM_WORLD
    dtype = getattr(torch, a.dtype)
    with overlap.Context(comm) as ctx:
        losses, times, init = train(ctx, comm, a, list(dict.fromkeys(a.strategy)), dtype)
    # The first step builds the plans; the median of the rest.
    results = {s: (losses[s], statistics.median(t[1:] if len(t) > 1 else t) * 1e3) for s, t in times.items()}
    status = 0
    if comm.rank == 0:
        ref = train_reference(init, a, comm.size, dtype) if a.check else None
        status = report(a, comm, results, ref)
    return comm.bcast(status, root=0)


if __name__ == "__main__":
    sys.exit(main())
