#!/usr/bin/env python3
"""A tensor-parallel MLP (Megatron's, with sequence parallelism) written the
ways a Python user can write it, side by side in one run: forward and
backward of fc1 (column-parallel, hidden -> 4 x hidden, GELU) and fc2
(row-parallel), on this rank's rows of the sequence.

Modes (--modes, all by default):
  torch-gloo        torch.distributed on gloo: all_gather, then all_reduce and
                    a slice for the reduce-scatter (torch 1.13's gloo has no
                    reduce_scatter), every collective after its GEMM
  torch-gloo-async  the same with Megatron's asynchronous backward: the input
                    gradient's all_reduce started, the weight gradient
                    computed meanwhile
  mpi4py            MPI collectives (Allgather, Reduce_scatter_block) from
                    mpi4py on the tensors' memory, torch's matmuls
  bulk, ring, automatic
                    overlap.torch's layers with that strategy (automatic is
                    timed once settled: --warmup steps first)

Every mode starts from the same weights and inputs; each mode's output,
input gradient and weight gradients are checked against the same MLP
computed whole on every rank in float64 (plain torch autograd). The modes'
steps are interleaved; each figure is the median over the measured steps of
the slowest rank.

  PYTHONPATH=build/python mpirun -n 2 python3 python/examples/tp_mlp_bench.py --seq 2048 --hidden 1024
  tools/vcluster/vcluster run -np 2 env PYTHONPATH=$PWD/build/python /usr/bin/python3 \\
      python/examples/tp_mlp_bench.py --json build/tp_mlp.json

gloo needs an address every rank reaches: rank 0's address on the
interface named by GLOO_SOCKET_IFNAME, else on its first interface with a
global IPv4 address (the emulated nodes have one), else 127.0.0.1.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.nn.functional as F
from mpi4py import MPI

import overlap
from overlap.torch import ColumnParallelLinear, RowParallelLinear
from train_gpt import cpu_model  # this folder's

MODES = ["torch-gloo", "torch-gloo-async", "mpi4py", "bulk", "ring", "automatic"]


def args_of(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=2048, help="rows of the sequence (a multiple of the ranks)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5, help="measured steps per mode (median reported)")
    p.add_argument("--warmup", type=int, default=8, help="unmeasured steps first (automatic settles in 7)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + " ".join(MODES))
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="largest error of a result, relative to the reference's largest magnitude")
    p.add_argument("--json", help="append one JSON object per mode to this file (rank 0)")
    a = p.parse_args(argv)
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in a.modes if m not in MODES]
    if bad or not a.modes:
        p.error(f"--modes: unknown {bad} (known: {', '.join(MODES)})")
    return a


# ------------------------------------------------------------- the problem


class Problem:
    """The whole weights and inputs (the same on every rank) and this rank's
    parts of them; the reference results, computed whole in float64."""

    def __init__(self, a, comm):
        R, r = comm.size, comm.rank
        h, f = a.hidden, 4 * a.hidden
        if a.seq % R or f % R:
            raise SystemExit(f"tp_mlp_bench: --seq {a.seq} and 4 x --hidden must be multiples of the {R} ranks "
                             "(gloo's all_gather takes equal parts)")
        g = torch.Generator().manual_seed(1)
        self.x, self.dz = torch.randn(a.seq, h, generator=g), torch.randn(a.seq, h, generator=g)
        self.w1, self.b1 = torch.randn(f, h, generator=g) / h ** 0.5, torch.randn(f, generator=g) * 0.1
        self.w2, self.b2 = torch.randn(h, f, generator=g) / f ** 0.5, torch.randn(h, generator=g) * 0.1
        self.rows = slice(r * a.seq // R, (r + 1) * a.seq // R)
        self.feats = slice(r * f // R, (r + 1) * f // R)
        self.reference = self._reference()

    def mine(self):
        """This rank's x, dz, w1, b1, w2, b2 (contiguous copies)."""
        rw, fs = self.rows, self.feats
        return (self.x[rw].clone(), self.dz[rw].clone(), self.w1[fs].clone(), self.b1[fs].clone(),
                self.w2[:, fs].contiguous(), self.b2.clone())

    def _reference(self):
        x, w1, b1, w2, b2 = (t.double().requires_grad_() for t in (self.x, self.w1, self.b1, self.w2, self.b2))
        z = F.gelu(x @ w1.t() + b1) @ w2.t() + b2
        z.backward(self.dz.double())
        rw, fs = self.rows, self.feats
        return {"z": z.detach()[rw], "dx": x.grad[rw], "dw1": w1.grad[fs], "db1": b1.grad[fs],
                "dw2": w2.grad[:, fs]}

    def error(self, got):
        """The largest error of any result, relative to its reference's largest magnitude."""
        return max(float((got[k].double() - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
                   for k, ref in self.reference.items())


def gelu_grad(p):
    cdf = 0.5 * (1.0 + torch.erf(p * 0.7071067811865476))
    return cdf + p * torch.exp(-0.5 * p * p) * 0.3989422804014327


# ------------------------------------------------------------------ the modes


def torch_gloo(prob, asynchronous):
    """Megatron's sequence-parallel MLP over torch.distributed (gloo)."""
    import torch.distributed as dist

    x, dz, w1, b1, w2, b2 = prob.mine()
    R, rw = dist.get_world_size(), prob.rows
    parts_x, parts_dz = [torch.empty_like(x) for _ in range(R)], [torch.empty_like(dz) for _ in range(R)]

    def step():
        dist.all_gather(parts_x, x)
        X = torch.cat(parts_x)
        P = torch.addmm(b1, X, w1.t())
        Y = F.gelu(P)
        Zp = Y @ w2.t()
        dist.all_reduce(Zp)  # gloo has no reduce_scatter: all of the sum, then this rank's rows
        z = Zp[rw] + b2
        dist.all_gather(parts_dz, dz)
        dZ = torch.cat(parts_dz)
        dW2 = dZ.t() @ Y
        dP = (dZ @ w2) * gelu_grad(P)
        dXp = dP @ w1
        if asynchronous:
            work = dist.all_reduce(dXp, async_op=True)
            dW1, dB1 = dP.t() @ X, dP.sum(0)  # while the all-reduce runs
            work.wait()
        else:
            dist.all_reduce(dXp)
            dW1, dB1 = dP.t() @ X, dP.sum(0)
        return {"z": z, "dx": dXp[rw], "dw1": dW1, "db1": dB1, "dw2": dW2}

    return step


def mpi4py_mode(prob, comm):
    """The same with MPI's own collectives on the tensors' memory."""
    x, dz, w1, b1, w2, b2 = prob.mine()
    S, h = prob.x.shape
    X, dZ = torch.empty(S, h), torch.empty(S, h)
    z, dx = torch.empty_like(x), torch.empty_like(x)

    def step():
        comm.Allgather(x.numpy(), X.numpy())
        P = torch.addmm(b1, X, w1.t())
        Y = F.gelu(P)
        Zp = (Y @ w2.t()).contiguous()
        comm.Reduce_scatter_block(Zp.numpy(), z.numpy(), op=MPI.SUM)
        comm.Allgather(dz.numpy(), dZ.numpy())
        dW2 = dZ.t() @ Y
        dP = (dZ @ w2) * gelu_grad(P)
        dXp = (dP @ w1).contiguous()
        comm.Reduce_scatter_block(dXp.numpy(), dx.numpy(), op=MPI.SUM)
        dW1, dB1 = dP.t() @ X, dP.sum(0)
        return {"z": z + b2, "dx": dx, "dw1": dW1, "db1": dB1, "dw2": dW2}

    return step


def overlap_mode(prob, ctx, strategy):
    """overlap.torch's layers (autograd)."""
    x, dz, w1, b1, w2, b2 = prob.mine()
    h = x.shape[1]
    fc1 = ColumnParallelLinear(ctx, h, w1.shape[0], strategy=strategy, activation="gelu")
    fc2 = RowParallelLinear(ctx, w1.shape[0], h, strategy=strategy)
    with torch.no_grad():
        fc1.weight.copy_(w1), fc1.bias.copy_(b1), fc2.weight.copy_(w2), fc2.bias.copy_(b2)

    def step():
        xr = x.detach().requires_grad_()
        for p in (fc1.weight, fc1.bias, fc2.weight, fc2.bias):
            p.grad = None
        z = fc2(fc1(xr), x.shape[0])
        z.backward(dz)
        return {"z": z.detach(), "dx": xr.grad, "dw1": fc1.weight.grad, "db1": fc1.bias.grad,
                "dw2": fc2.weight.grad}

    return step


def init_gloo(comm):
    """torch.distributed on gloo, at rank 0's address (the module's docstring)."""
    import torch.distributed as dist

    ifname, addr = local_interface()
    if ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
    addr, port = comm.bcast((addr, port), root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=comm.rank, world_size=comm.size,
                            timeout=timedelta(seconds=120))


def local_interface():
    """(interface, IPv4 address): GLOO_SOCKET_IFNAME's, else the first with a
    global address, else (None, 127.0.0.1)."""
    want = os.environ.get("GLOO_SOCKET_IFNAME")
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    for line in out.splitlines():
        fields = line.split()
        name, address = fields[1], fields[3].split("/")[0]
        if want is None or name == want:
            return name, address
    return None, "127.0.0.1"


# ------------------------------------------------------------------ the run


def run(a, comm, ctx, prob):
    steps = {}
    for m in a.modes:
        if m.startswith("torch-gloo"):
            steps[m] = torch_gloo(prob, m.endswith("async"))
        elif m == "mpi4py":
            steps[m] = mpi4py_mode(prob, comm)
        else:
            steps[m] = overlap_mode(prob, ctx, m)
    times, errors = {m: [] for m in a.modes}, {}
    for it in range(a.warmup + a.steps):
        for m, step in steps.items():
            comm.Barrier()
            t0 = time.perf_counter()
            got = step()
            dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if it >= a.warmup:
                times[m].append(dt * 1e3)
            if it == 0 or it == a.warmup + a.steps - 1:
                errors[m] = max(errors.get(m, 0.0), comm.allreduce(prob.error(got), op=MPI.MAX))
    return {m: statistics.median(t) for m, t in times.items()}, errors


def report(a, comm, medians, errors):
    ok = all(e <= a.tolerance for e in errors.values())
    if comm.rank != 0:
        return ok
    base = a.modes[0]
    print(f"tp_mlp_bench: seq {a.seq}, hidden {a.hidden}, ffn {4 * a.hidden}, f32, {comm.size} ranks, forward + "
          f"backward; median of {a.steps} steps of the slowest rank; torch {torch.__version__}, "
          f"{MPI.Get_library_version().splitlines()[0].strip()}")
    print(f"{'mode':<18}{'step ms':>10}{'x ' + base:>22}{'max rel err':>14}")
    for m in a.modes:
        print(f"{m:<18}{medians[m]:>10.1f}{medians[base] / medians[m]:>21.2f}x{errors[m]:>14.1e}")
    print(f"results against float64 torch: {'ok' if ok else 'FAILED'} (tolerance {a.tolerance:.0e})")
    if a.json:
        with open(a.json, "a") as f:
            for m in a.modes:
                f.write(json.dumps({
                    "example": "tp_mlp_bench", "mode": m, "step_ms": medians[m], "max_rel_err": errors[m],
                    "checked": True, "ranks": comm.size, "seq": a.seq, "hidden": a.hidden, "steps": a.steps,
                    "warmup": a.warmup, "threads": a.threads,
                    "transport": os.environ.get("OVERLAP_TRANSPORT", "unspecified"), "cpu": cpu_model(),
                    "isa": overlap._core.cpu_isa(), "torch": torch.__version__, "overlap": overlap.__version__,
                    "mpi": MPI.Get_library_version().splitlines()[0].strip(),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                }) + "\n")
    return ok


def main(argv=None):
    a = args_of(argv)
    torch.set_num_threads(a.threads)
    comm = MPI.COMM_WORLD
    prob = Problem(a, comm)
    if any(m.startswith("torch-gloo") for m in a.modes):
        init_gloo(comm)
    with overlap.Context(comm) as ctx:
        medians, errors = run(a, comm, ctx, prob)
    ok = report(a, comm, medians, errors)
    if any(m.startswith("torch-gloo") for m in a.modes):
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0 if comm.bcast(ok, root=0) else 1


if __name__ == "__main__":
    sys.exit(main())
