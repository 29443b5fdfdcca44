#!/usr/bin/env python3
"""A tensor-parallel MLP through overlap.torch, forward + backward, with
every strategy side by side: fc1 column-parallel (hidden -> ffn = 4 x hidden,
split over the ranks), GELU, fc2 row-parallel (sequence parallel), on this
rank's rows of the sequence. The modes' steps are interleaved; each figure
is the median over the measured steps of the slowest rank. automatic is
timed once it has settled (OVERLAP_AUTOMATIC=measured times its candidates
on the first calls of each shape): --warmup steps first.

  PYTHONPATH=build/python mpirun -n 2 python3 bench/torch_mlp.py --seq 2048 --hidden 1024
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from mpi4py import MPI

import overlap
from overlap.torch import ColumnParallelLinear, RowParallelLinear, even_split


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5, help="measured steps (median reported)")
    ap.add_argument("--warmup", type=int, default=8, help="unmeasured steps first (automatic settles in 7)")
    ap.add_argument("--modes", default="bulk,ring,automatic")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    R, r = comm.Get_size(), comm.Get_rank()
    torch.manual_seed(1)
    torch.set_num_threads(1)
    modes = a.modes.split(",")
    h, ffn = a.hidden, 4 * a.hidden
    f = even_split(ffn, R)[r]
    rows = even_split(a.seq, R)[r]
    with overlap.Context(comm) as ctx:
        layers = {}
        for m in modes:
            fc1 = ColumnParallelLinear(ctx, h, f, strategy=m)
            fc2 = RowParallelLinear(ctx, f, h, strategy=m)
            if layers:  # every mode from the first mode's weights
                first = next(iter(layers.values()))
                with torch.no_grad():
                    fc1.weight.copy_(first[0].weight)
                    fc2.weight.copy_(first[1].weight)
            layers[m] = (fc1, fc2)
        x = torch.randn(rows, h, requires_grad=True)
        dout = torch.randn(rows, h)

        def step(m):
            fc1, fc2 = layers[m]
            y = fc2(F.gelu(fc1(x)), rows)
            y.backward(dout)

        times = {m: [] for m in modes}
        for it in range(a.warmup + a.steps):
            for m in modes:
                comm.Barrier()
                t0 = time.perf_counter()
                step(m)
                dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                if it >= a.warmup:
                    times[m].append(dt * 1e3)
    if r != 0:
        return
    print(f"torch_mlp: seq {a.seq} hidden {h} ffn {ffn} f32 on {R} ranks, forward + backward; "
          f"median of {a.steps} steps, slowest rank; torch {torch.__version__}")
    base = statistics.median(times[modes[0]])
    for m in modes:
        ms = statistics.median(times[m])
        print(f"{m:<12}{ms:>10.1f} ms{base / ms:>9.3f}x")


if __name__ == "__main__":
    main()
