#!/usr/bin/env python3
"""Trains a small GPT-style decoder with tensor and sequence parallelism,
bulk against overlapped, and checks its loss curve against the same model
in plain single-process PyTorch. The model is written in plain PyTorch;
overlap.torch.parallelize splits its blocks' linear layers over the ranks.

    mpirun -n 2 python3 python/examples/train_gpt.py --steps 20 --strategy bulk ring --check

Every rank trains one model per strategy, all from the same initial
weights on the same data, their steps interleaved so that the machine's
drift reaches every strategy alike. The model: token and position embeddings, ``--layers`` pre-norm
blocks (causal multi-head attention with fused QKV, a GELU MLP), a final
layer norm and an LM head, trained with AdamW on a synthetic sequence task.
The blocks' linear layers are split over the ranks (whole heads and MLP
features; transformer_plan); activations between them are sharded by
sequence (sequence-first rows): each rank embeds its part of the sequence.

Prints each strategy's median step time (the slowest rank's) and the speedup
over bulk; --json FILE appends one JSON object per strategy (step_ms,
final_loss, losses, where it ran); --check runs the single-process model on
rank 0 and fails when a loss differs by more than --tolerance (relative).
"""

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn

import overlap
from overlap.torch import allreduce_replicated_grads, parallelize, sequence_slice, transformer_plan


def args_of(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per strategy")
    p.add_argument("--strategy", nargs="+", default=["bulk", "ring"], choices=["bulk", "ring", "automatic",
                                                                                "bidirectional"],
                   help="strategies to train, one model each, steps interleaved")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=512, help="sequence length")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: torch's default)")
    p.add_argument("--phases", default="both", choices=["both", "compute_only", "comm_only"],
                   help="what overlap's ops run: compute_only and comm_only time the two sides of the bound "
                        "(the results are then wrong)")
    p.add_argument("--json", help="append one JSON object per strategy to this file")
    p.add_argument("--check", action="store_true", help="compare the losses with single-process PyTorch")
    p.add_argument("--tolerance", type=float, default=2e-3, help="--check: largest relative loss difference")
    return p.parse_args(argv)


# ------------------------------------------------------------------ the data


def batch_of(step, a):
    """Tokens (seq + 1, batch), the same on every rank: each sequence follows
    a fixed random successor table with some noise, so the loss can fall."""
    g = torch.Generator().manual_seed(a.seed * 1000 + step)
    table = torch.randperm(a.vocab, generator=torch.Generator().manual_seed(a.seed))
    t = torch.empty(a.seq + 1, a.batch, dtype=torch.long)
    t[0] = torch.randint(a.vocab, (a.batch,), generator=g)
    for i in range(1, a.seq + 1):
        noise = torch.randint(a.vocab, (a.batch,), generator=g)
        keep = torch.rand(a.batch, generator=g) < 0.8
        t[i] = torch.where(keep, table[t[i - 1]], noise)
    return t


# ------------------------------------------------------------------ the model


class Block(nn.Module):
    """A pre-norm decoder block in plain PyTorch. Its attention takes the
    head count from its QKV projection's width, so the same code runs whole
    and parallelized (each rank then has its heads)."""

    def __init__(self, h, heads):
        super().__init__()
        self.head_dim = h // heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)  # q, k and v stacked: one gather when parallelized
        self.proj = nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        for m in (self.qkv, self.proj, self.fc1, self.fc2):
            nn.init.normal_(m.weight, std=0.02)
            nn.init.normal_(m.bias, std=0.02)

    def forward(self, x):  # x: (seq, batch, h), or this rank's part of seq
        q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)  # every row of seq
        x = x + self.proj(attention(q, k, v, self.head_dim))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def attention(q, k, v, head_dim):
    """Causal attention of (s, b, heads * head_dim) projections; returns
    (s, b, heads * head_dim)."""
    s, b, width = q.shape
    heads = width // head_dim

    def split(t):
        return t.reshape(s, b, heads, head_dim).permute(1, 2, 0, 3)

    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(-1, -2) / math.sqrt(max(head_dim, 1))
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    o = torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ v
    return o.permute(2, 0, 1, 3).reshape(s, b, width)


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        torch.manual_seed(a.seed)
        self.tok = nn.Embedding(a.vocab, a.hidden)
        self.pos = nn.Embedding(a.seq, a.hidden)
        self.blocks = nn.ModuleList([Block(a.hidden, a.heads) for _ in range(a.layers)])
        self.lnf = nn.LayerNorm(a.hidden)
        self.head = nn.Linear(a.hidden, a.vocab, bias=False)

    def forward(self, tokens, first=0):
        """tokens: (seq, batch), the positions from ``first`` on."""
        x = self.tok(tokens) + self.pos(torch.arange(first, first + tokens.shape[0]))[:, None]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.lnf(x))


def tensor_parallel(model, ctx, a, strategy):
    """The model with its blocks' linear layers split over the ranks of ctx
    (whole heads of the QKV and output projections, the MLP's features),
    sequence parallel: its input and output are this rank's rows."""
    plan = transformer_plan("blocks.*", a.hidden // a.heads, qkv="qkv", out="proj", up="fc1", down="fc2")
    return parallelize(model, ctx, plan, sequence_parallel=True, strategy=strategy)


# ------------------------------------------------------------------ training


def train_tp(ctx, comm, a, strategies):
    """Trains one model per strategy, all from the same weights on the same
    data, their steps interleaved (step 1 of each, then step 2 of each, ...)
    so that the machine's drift reaches every strategy alike. Returns each
    strategy's losses and step times (the slowest rank's)."""
    models = {s: tensor_parallel(GPT(a), ctx, a, s) for s in strategies}
    opts = {s: torch.optim.AdamW(m.parameters(), lr=a.lr) for s, m in models.items()}
    losses = {s: [] for s in strategies}
    times = {s: [] for s in strategies}
    tokens = a.seq * a.batch
    for step in range(a.steps):
        data = batch_of(step, a)
        for s, model in models.items():
            comm.Barrier()
            t0 = time.perf_counter()
            mine = sequence_slice(a.seq, ctx)
            logits = model(data[:-1][mine], mine.start)
            target = data[1:][mine].reshape(-1)
            loss = F.cross_entropy(logits.reshape(-1, a.vocab).float(), target, reduction="sum") / tokens
            opts[s].zero_grad(set_to_none=True)
            loss.backward()
            allreduce_replicated_grads(model.parameters(), comm)
            opts[s].step()
            dt = time.perf_counter() - t0
            times[s].append(comm.allreduce(dt, op=MPI.MAX))
            losses[s].append(comm.allreduce(loss.item(), op=MPI.SUM))
    return losses, times


def train_reference(a):
    model = GPT(a)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    losses = []
    for step in range(a.steps):
        data = batch_of(step, a)
        loss = F.cross_entropy(model(data[:-1]).reshape(-1, a.vocab), data[1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def cpu_model():
    """The CPU's name, with its family and model numbers (as the C++ apps
    record it: one name can cover generations whose cores differ by 2x)."""
    try:
        with open("/proc/cpuinfo") as f:
            fields = {}
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.machine()
    name = fields.get("model name")
    if not name:
        return platform.machine()
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def provenance():
    """Where a run ran, for its JSON rows: the transport (OVERLAP_TRANSPORT),
    the CPU and the ISA its GEMMs use, the versions and the date."""
    return {"transport": os.environ.get("OVERLAP_TRANSPORT", "unspecified"), "cpu": cpu_model(),
            "isa": overlap._core.cpu_isa(), "torch": torch.__version__, "overlap": overlap.__version__,
            "mpi": MPI.Get_library_version().splitlines()[0].strip(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def compare(results, ref, a):
    """Prints each strategy's speedup over bulk and, with reference losses,
    the largest relative loss difference from them. Returns (that difference
    or None, the exit status: 1 past --tolerance)."""
    if "bulk" in results:
        for s, (_, ms) in results.items():
            if s != "bulk":
                print(f"speedup of {s} over bulk: {results['bulk'][1] / ms:.3f}x")
    if not ref:
        return None, 0
    worst = max(abs(x - y) / abs(y) for losses, _ in results.values() for x, y in zip(losses, ref))
    ok = worst <= a.tolerance
    print(f"loss parity with single-process PyTorch over {a.steps} steps: largest relative difference "
          f"{worst:.2e} (tolerance {a.tolerance:.0e}): {'ok' if ok else 'FAILED'}")
    print("reference losses: " + " ".join(f"{x:.4f}" for x in ref))
    return worst, 0 if ok else 1


def main(argv=None):
    a = args_of(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    comm = MPI.COMM_WORLD
    rank = comm.rank
    results = {}
    with overlap.Context(comm, phases=a.phases) as ctx:
        all_losses, all_times = train_tp(ctx, comm, a, list(dict.fromkeys(a.strategy)))
        for strategy, losses in all_losses.items():
            times = all_times[strategy]
            # The first step builds the plans; the median of the rest.
            step_ms = statistics.median(times[1:] if len(times) > 1 else times) * 1e3
            results[strategy] = (losses, step_ms)
            if rank == 0:
                print(f"{strategy:>13}: step {step_ms:9.2f} ms (median of {max(len(times) - 1, 1)}, slowest rank), "
                      f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    status = 0
    if rank == 0:
        ref = train_reference(a) if a.check else None
        worst, status = compare(results, ref, a)
        if a.json:
            with open(a.json, "a") as f:
                for s, (losses, ms) in results.items():
                    f.write(json.dumps({
                        "example": "train_gpt", "strategy": s, "ranks": comm.size, "step_ms": ms,
                        "final_loss": losses[-1], "losses": losses, "reference_losses": ref,
                        "max_rel_loss_diff": worst, "steps": a.steps, "phases": a.phases, "layers": a.layers,
                        "hidden": a.hidden, "heads": a.heads, "seq": a.seq, "batch": a.batch, **provenance(),
                    }) + "\n")
    return comm.bcast(status, root=0)


if __name__ == "__main__":
    sys.exit(main())
