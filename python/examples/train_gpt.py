#!/usr/bin/env python3
"""Trains a small GPT-style decoder with tensor and sequence parallelism,
bulk against overlapped, and checks its loss curve against the same model
in plain single-process PyTorch. The model is written in plain PyTorch;
overlap.torch.parallelize splits its blocks' linear layers over the ranks.

    mpirun -n 2 python3 python/examples/train_gpt.py --steps 20 --strategy bulk ring --check
    mpirun -n 4 python3 python/examples/train_gpt.py --tp 2 --dp-sync after overlapped --check

With ``--tp T`` below the rank count, the ranks form tensor groups of T
consecutive ranks and the groups are data-parallel replicas: each trains on
its own ``--batch`` sequences, and the replicas' gradients are averaged after
the backward (``--dp-sync after``: one MPI_Allreduce), during it
(``overlapped``: overlap.torch.DistributedDataParallel), or never
(``none``: the bound; not the same training). One model per strategy and
dp sync.

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
from overlap.torch import (DistributedDataParallel, allreduce_replicated_grads, parallelize, sequence_slice,
                           transformer_plan)


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
    p.add_argument("--tp", type=int, default=0, help="ranks per tensor group (0: all); the groups are dp replicas")
    p.add_argument("--dp-sync", nargs="+", default=["overlapped"], choices=["after", "overlapped", "none"],
                   help="with dp replicas: how their gradients are averaged, one model each")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="--dp-sync overlapped: bucket size (MiB)")
    p.add_argument("--json", help="append one JSON object per strategy (and dp sync) to this file")
    p.add_argument("--check", action="store_true", help="compare the losses with single-process PyTorch")
    p.add_argument("--tolerance", type=float, default=2e-3, help="--check: largest relative loss difference")
    return p.parse_args(argv)


# ------------------------------------------------------------------ the data


def batch_of(step, a, replicas=1):
    """Tokens (seq + 1, batch * replicas), the same on every rank: each
    sequence follows a fixed random successor table with some noise, so the
    loss can fall. Replica r trains on columns [r * batch, (r + 1) * batch)."""
    g = torch.Generator().manual_seed(a.seed * 1000 + step)
    table = torch.randperm(a.vocab, generator=torch.Generator().manual_seed(a.seed))
    n = a.batch * replicas
    t = torch.empty(a.seq + 1, n, dtype=torch.long)
    t[0] = torch.randint(a.vocab, (n,), generator=g)
    for i in range(1, a.seq + 1):
        noise = torch.randint(a.vocab, (n,), generator=g)
        keep = torch.rand(n, generator=g) < 0.8
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


class Mesh:
    """The ranks as tensor groups of --tp consecutive ranks (ctx, tp_comm)
    and data-parallel replicas of the same shards (dp_comm)."""

    def __init__(self, comm, a):
        self.tp = a.tp or comm.size
        if self.tp < 1 or comm.size % self.tp:
            raise SystemExit(f"train_gpt.py: --tp {a.tp} must divide the {comm.size} ranks")
        self.dp = comm.size // self.tp
        self.tp_comm = comm.Split(comm.rank // self.tp, comm.rank)
        self.dp_comm = comm.Split(comm.rank % self.tp, comm.rank)
        self.replica = comm.rank // self.tp


def average_after(model, dp_comm):
    """The gradients averaged over the replicas after the backward: one
    MPI_Allreduce of all of them (the bulk baseline)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dp_comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
    flat /= dp_comm.size
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()


def train_tp(ctx, comm, mesh, a, runs):
    """Trains one model per run (strategy, dp sync), all from the same
    weights on the same data, their steps interleaved (step 1 of each, then
    step 2 of each, ...) so that the machine's drift reaches every run alike.
    Returns each run's losses (the mean over the replicas) and step times
    (the slowest rank's)."""
    models = {}
    for s, sync in runs:
        m = tensor_parallel(GPT(a), ctx, a, s)
        if mesh.dp > 1 and sync == "overlapped":
            m = DistributedDataParallel(m, mesh.dp_comm, bucket_cap_mb=a.bucket_mb)
        models[(s, sync)] = m
    opts = {r: torch.optim.AdamW(m.parameters(), lr=a.lr) for r, m in models.items()}
    losses = {r: [] for r in runs}
    times = {r: [] for r in runs}
    tokens = a.seq * a.batch
    cols = slice(mesh.replica * a.batch, (mesh.replica + 1) * a.batch)
    for step in range(a.steps):
        data = batch_of(step, a, mesh.dp)[:, cols]
        for (s, sync), model in models.items():
            comm.Barrier()
            t0 = time.perf_counter()
            mine = sequence_slice(a.seq, ctx)
            logits = model(data[:-1][mine], mine.start)
            target = data[1:][mine].reshape(-1)
            loss = F.cross_entropy(logits.reshape(-1, a.vocab).float(), target, reduction="sum") / tokens
            opts[(s, sync)].zero_grad(set_to_none=True)
            loss.backward()
            allreduce_replicated_grads(model.parameters(), mesh.tp_comm)
            if mesh.dp > 1 and sync == "after":
                average_after(model, mesh.dp_comm)
            opts[(s, sync)].step()
            dt = time.perf_counter() - t0
            times[(s, sync)].append(comm.allreduce(dt, op=MPI.MAX))
            losses[(s, sync)].append(comm.allreduce(loss.item(), op=MPI.SUM) / mesh.dp)
    for m in models.values():
        if isinstance(m, DistributedDataParallel):
            m.close()  # its rings' thread stops before MPI does
    return losses, times


def train_reference(a, replicas):
    """The same training in one process, on every replica's sequences."""
    model = GPT(a)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    losses = []
    for step in range(a.steps):
        data = batch_of(step, a, replicas)
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
    """Prints each run's speedup over the first and, with reference losses,
    the largest relative loss difference from them of the runs that average
    their gradients. Returns (that difference or None, the exit status: 1
    past --tolerance)."""
    labels = list(results)
    for label in labels[1:]:
        print(f"speedup of {label} over {labels[0]}: {results[labels[0]][1] / results[label][1]:.3f}x")
    checked = [losses for label, (losses, _) in results.items() if not label.endswith("dp none")]
    if not ref or not checked:
        return None, 0
    worst = max(abs(x - y) / abs(y) for losses in checked for x, y in zip(losses, ref))
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
    mesh = Mesh(comm, a)
    syncs = list(dict.fromkeys(a.dp_sync)) if mesh.dp > 1 else ["none"]
    runs = [(s, sync) for s in dict.fromkeys(a.strategy) for sync in syncs]
    results, rows = {}, []
    with overlap.Context(mesh.tp_comm, phases=a.phases) as ctx:
        all_losses, all_times = train_tp(ctx, comm, mesh, a, runs)
        for (strategy, sync), losses in all_losses.items():
            times = all_times[(strategy, sync)]
            # The first step builds the plans; the median of the rest.
            step_ms = statistics.median(times[1:] if len(times) > 1 else times) * 1e3
            label = strategy if mesh.dp == 1 else f"{strategy} dp {sync}"
            results[label] = (losses, step_ms)
            rows.append({"strategy": strategy, "dp_sync": sync if mesh.dp > 1 else None, "losses": losses,
                         "step_ms": step_ms})
            if rank == 0:
                print(f"{label:>22}: step {step_ms:9.2f} ms (median of {max(len(times) - 1, 1)}, slowest rank), "
                      f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    status = 0
    if rank == 0:
        ref = train_reference(a, mesh.dp) if a.check else None
        worst, status = compare(results, ref, a)
        if a.json:
            with open(a.json, "a") as f:
                for r in rows:
                    f.write(json.dumps({
                        "example": "train_gpt", "strategy": r["strategy"], "dp_sync": r["dp_sync"],
                        "ranks": comm.size, "tp": mesh.tp, "dp": mesh.dp, "step_ms": r["step_ms"],
                        "final_loss": r["losses"][-1], "losses": r["losses"], "reference_losses": ref,
                        "max_rel_loss_diff": worst, "steps": a.steps, "phases": a.phases, "layers": a.layers,
                        "hidden": a.hidden, "heads": a.heads, "seq": a.seq, "batch": a.batch,
                        "bucket_mb": a.bucket_mb, **provenance(),
                    }) + "\n")
    mesh.tp_comm.Free()
    mesh.dp_comm.Free()
    return comm.bcast(status, root=0)


if __name__ == "__main__":
    sys.exit(main())
