"""The ops from Python against NumPy (float64) references: every layout,
strategy and dtype, uneven and empty shards, transposed operands, the
epilogue, accumulate, gathered_out, several products, started ops and
schedules."""

import os

import numpy as np
import pytest
import torch

import overlap
from conftest import rng_for, shard_sizes, split

LAYOUTS = ["lhs_rows", "lhs_cols", "rhs_rows", "rhs_cols"]
STRATEGIES = ["bulk", "ring", "bidirectional"]
# (library, dtype, tolerance relative to the largest |value| of the reference)
DTYPES = [("numpy", np.float32, 1e-5), ("numpy", np.float64, 1e-12), ("torch", torch.float32, 1e-5),
          ("torch", torch.float64, 1e-12), ("torch", torch.bfloat16, 2e-2)]


def as_kind(x, kind, dtype):
    x = np.ascontiguousarray(x)
    return x.astype(dtype) if kind == "numpy" else torch.from_numpy(x).to(dtype)


def as_numpy(x):
    return x.astype(np.float64) if isinstance(x, np.ndarray) else x.to(torch.float64).numpy()


def close(got, want, tol):
    return np.abs(as_numpy(got) - want).max(initial=0) <= tol * max(1.0, np.abs(want).max(initial=0))


def ag_problem(comm, layout, m=7, n=6, k=5, seed=1):
    """Global A (m x k) and B (k x n), this rank's shard of the gathered one
    and its part of the other operand, and the reference of this rank's c."""
    g = rng_for(seed)
    r, R = comm.rank, comm.size
    A, B = g.standard_normal((m, k)), g.standard_normal((k, n))
    loc = shard_sizes({"lhs_rows": m, "lhs_cols": k, "rhs_rows": k, "rhs_cols": n}[layout], R)
    own = shard_sizes(n if layout.startswith("lhs") else m, R, uneven=False)  # the other operand's free extent
    if layout == "lhs_rows":
        a, b = split(A, loc, r, 0), split(B, own, r, 1)
        want = A @ b
    elif layout == "lhs_cols":
        a, b = split(A, loc, r, 1), split(B, own, r, 1)
        want = A @ b
    elif layout == "rhs_rows":
        a, b = split(A, own, r, 0), split(B, loc, r, 0)
        want = a @ B
    else:
        a, b = split(A, own, r, 0), split(B, loc, r, 1)
        want = a @ B
    return a, b, want, (A if layout.startswith("lhs") else B)


@pytest.mark.parametrize("kind,dtype,tol", DTYPES)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_all_gather_matmul(ctx, comm, layout, strategy, kind, dtype, tol):
    a, b, want, X = ag_problem(comm, layout)
    c, gathered = overlap.all_gather_matmul(ctx, as_kind(a, kind, dtype), as_kind(b, kind, dtype),
                                            gathered=layout, strategy=strategy, gathered_out=True)
    assert type(c) is type(gathered) is (np.ndarray if kind == "numpy" else torch.Tensor)
    assert tuple(c.shape) == want.shape
    assert close(c, want, tol)
    assert close(gathered, as_numpy(as_kind(X, kind, dtype)), 0)


def sum_problem(comm, seed, m=9, n=7):
    """Every rank's A_r (m x K_r) and B_r (K_r x n), K_r uneven with an empty
    one at 2 and 3 ranks, and their sum of products."""
    g = rng_for(seed)
    R = comm.size
    ks = [4, 0, 3][:R] if R <= 3 else [2] * R
    A = [g.standard_normal((m, k)) for k in ks]
    B = [g.standard_normal((k, n)) for k in ks]
    return A, B, sum(a @ b for a, b in zip(A, B))


@pytest.mark.parametrize("kind,dtype,tol", DTYPES)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("scattered", ["rows", "cols"])
def test_matmul_reduce_scatter(ctx, comm, scattered, strategy, kind, dtype, tol):
    r, R = comm.rank, comm.size
    m, n = 9, 7
    A, B, total = sum_problem(comm, 2, m, n)
    # The library's even split when out is not given; an uneven one through out.
    even = overlap.matmul_reduce_scatter(ctx, as_kind(A[r], kind, dtype), as_kind(B[r], kind, dtype),
                                         scattered=scattered, strategy=strategy)
    sizes = shard_sizes(m if scattered == "rows" else n, R)
    out = as_kind(np.zeros((sizes[r], n) if scattered == "rows" else (m, sizes[r])), kind, dtype)
    got = overlap.matmul_reduce_scatter(ctx, as_kind(A[r], kind, dtype), as_kind(B[r], kind, dtype), out,
                                        scattered=scattered, strategy=strategy)
    evens = shard_sizes(m if scattered == "rows" else n, R, uneven=False)
    assert got is out
    assert close(even, split(total, evens, r, 0 if scattered == "rows" else 1), tol * R)
    assert close(got, split(total, sizes, r, 0 if scattered == "rows" else 1), tol * R)


@pytest.mark.parametrize("kind,dtype,tol", DTYPES)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("reduced", ["rows", "cols"])
def test_matmul_all_reduce(ctx, comm, reduced, strategy, kind, dtype, tol):
    r, R = comm.rank, comm.size
    A, B, total = sum_problem(comm, 11)
    m, n = total.shape
    got = overlap.matmul_all_reduce(ctx, as_kind(A[r], kind, dtype), as_kind(B[r], kind, dtype), reduced=reduced,
                                    strategy=strategy)
    out = as_kind(np.ones((m, n)), kind, dtype)
    into = overlap.matmul_all_reduce(ctx, as_kind(A[r], kind, dtype), as_kind(B[r], kind, dtype), out,
                                     reduced=reduced, strategy=strategy, accumulate=True)
    assert type(got) is (np.ndarray if kind == "numpy" else torch.Tensor)
    assert tuple(got.shape) == (m, n)
    assert into is out
    assert close(got, total, tol * R)
    assert close(out, total + 1, tol * R)


@pytest.mark.parametrize("strategy", ["bulk", "ring"])
def test_matmul_all_reduce_transposed_bias_started(ctx, comm, strategy):
    g = rng_for(12)
    R = comm.size
    P, Q = g.standard_normal((5, 2 * R)), g.standard_normal((2 * R, 4))
    bias = g.standard_normal(4)
    mine = slice(2 * comm.rank, 2 * comm.rank + 2)
    # Read transposed, without a copy; the epilogue applies once, after the sum.
    c = overlap.matmul_all_reduce(ctx, P[:, mine].T.copy().T, Q[mine].T.copy().T, bias=bias, activation="relu",
                                  strategy=strategy)
    h = overlap.start_matmul_all_reduce(ctx, P[:, mine], Q[mine], strategy=strategy, reduced="cols")
    started = h.wait()
    s = overlap.schedule_of(ctx, "matmul_all_reduce", P[:, mine], Q[mine], strategy=strategy)
    assert close(c, np.maximum(P @ Q + bias, 0), 1e-12)
    assert close(started, P @ Q, 1e-12)
    assert s["strategy"] == (strategy if R > 1 else s["strategy"])


@pytest.mark.parametrize("strategy", ["bulk", "ring"])
def test_transposed_operands_bias_activation(ctx, comm, strategy):
    a, b, _, _ = ag_problem(comm, "lhs_rows", seed=3)
    A = np.concatenate(comm.allgather(a))
    bias = rng_for(4).standard_normal(b.shape[1])
    # a.T.copy().T and b.T.copy().T are column-major: read transposed, without a copy.
    c = overlap.all_gather_matmul(ctx, a.T.copy().T, b.T.copy().T, bias=bias, activation="relu", strategy=strategy)
    g = rng_for(10)
    P, Q = g.standard_normal((5, 2 * comm.size)), g.standard_normal((2 * comm.size, 4))
    mine = slice(2 * comm.rank, 2 * comm.rank + 2)
    rs = overlap.matmul_reduce_scatter(ctx, P[:, mine].T.copy().T, Q[mine], scattered="cols",
                                       strategy=strategy)
    assert close(c, np.maximum(A @ b + bias, 0), 1e-12)
    assert close(rs, split(P @ Q, shard_sizes(4, comm.size, uneven=False), comm.rank, 1), 1e-12)


def test_accumulate_and_out(ctx, comm):
    a, b, want, _ = ag_problem(comm, "lhs_rows", seed=5)
    out = np.ones(want.shape)
    got = overlap.all_gather_matmul(ctx, a, b, out, accumulate=True, strategy="ring")
    assert got is out
    assert close(out, want + 1, 1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_several_products(ctx, comm, layout):
    a, b, _, _ = ag_problem(comm, layout, seed=6)
    lhs = layout.startswith("lhs")
    others = [b, 2 * b, b[:, :2].copy()] if lhs else [a, 2 * a, a[:2].copy()]
    cs = overlap.all_gather_matmul(ctx, a if lhs else others, others if lhs else b, gathered=layout, strategy="ring")
    # Against the single call, which test_all_gather_matmul checks against NumPy.
    singles = [overlap.all_gather_matmul(ctx, a if lhs else o, o if lhs else b, gathered=layout, strategy="bulk")
               for o in others]
    assert len(cs) == 3
    for c, s in zip(cs, singles):
        assert close(c, as_numpy(s), 1e-12)


def test_started_ops(ctx, comm):
    a, b, want, _ = ag_problem(comm, "lhs_rows", seed=7)
    h = overlap.start_all_gather_matmul(ctx, a, b, strategy="ring")
    side = np.ones((64, 64)) @ np.ones((64, 64))  # the caller's own work meanwhile
    while not h.test():
        pass
    c = h.wait()
    g = rng_for(8)
    A, B = g.standard_normal((6, 3 * comm.size)), g.standard_normal((3 * comm.size, 4))
    mine = slice(3 * comm.rank, 3 * comm.rank + 3)
    h2 = overlap.start_matmul_reduce_scatter(ctx, A[:, mine], B[mine], strategy="ring")
    rs = h2.wait()
    rows = shard_sizes(6, comm.size, uneven=False)
    assert side[0, 0] == 64
    assert close(c, want, 1e-12)
    assert close(rs, split(A @ B, rows, comm.rank, 0), 1e-12)


def test_schedule_of(ctx, comm):
    a, b, _, _ = ag_problem(comm, "lhs_rows", seed=9)
    s = overlap.schedule_of(ctx, "all_gather_matmul", a, b, strategy="ring")
    # M and N agree across the ranks; K_r (b's columns here) may not.
    ra, rb = np.ones((6, b.shape[1]), np.float32), np.ones((b.shape[1], 4), np.float32)
    bulk = overlap.schedule_of(ctx, "matmul_reduce_scatter", ra, rb, strategy="bulk", scattered="cols")
    assert s["strategy"] == ("ring" if comm.size > 1 else s["strategy"])
    assert s["chunks"] >= (1 if comm.size > 1 else 0)
    assert set(s) >= {"strategy", "algorithm", "lanes", "chunks", "by_model", "predicted_s", "candidates", "text"}
    assert bulk["strategy"] == "bulk" and bulk["chunks"] == 0


def test_context_settings(comm):
    with overlap.Context(comm, progress="poll", ag_chunks=3, timeout_s=30) as c:
        s = c.settings()
        assert (c.rank, c.size) == (comm.rank, comm.size)
    assert s["progress"] == "poll" and s["ag_chunks"] == "3" and s["timeout_s"] == "30"
    assert c.closed


def test_calibration_bindings(comm, tmp_path_factory):
    """measuring() and save_calibration() reach the context: nothing is
    measured before a call; a calibration is written only where a model was
    needed (spanning nodes), and a later context loads what was written."""
    path = comm.bcast(str(tmp_path_factory.mktemp("calibration") / "c.json") if comm.rank == 0 else None)
    with overlap.Context(comm) as c:
        assert c.comm is comm and c.measuring() == 0
        x = np.ones((3, 4), np.float32)
        overlap.all_gather_matmul(c, x, np.ones((4, 2), np.float32))
        measuring = c.measuring()
        assert comm.allgather(measuring) == [measuring] * comm.size
        saved = c.save_calibration(path)
    assert comm.allgather(saved) == [saved] * comm.size
    if comm.rank == 0:
        assert os.path.exists(path) == saved
    if saved:
        with overlap.Context(comm, calibration=path) as c:
            assert c.settings()["calibration"] == path
