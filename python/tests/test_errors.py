"""Bad input on one rank raises the same error on every rank (ValueError,
TypeError for a wrong type or dtype), never a hang, and the context stays
usable."""

import numpy as np
import pytest
import torch

import overlap
from conftest import rng_for


def operands(comm, m=4, k=5, n=3):
    g = rng_for(20)
    return g.standard_normal((m, k)), g.standard_normal((k, n))


def last(comm):
    """Whether this rank is the one given bad input (the last)."""
    return comm.rank == comm.size - 1


def raised_on_every_rank(error, call, comm, text):
    with pytest.raises(error) as e:
        call()
    assert text in str(e.value), str(e.value)
    return str(e.value)


def test_dtype_on_one_rank(ctx, comm):
    a, b = operands(comm)
    bad = a.astype(np.float32) if last(comm) else a
    msg = raised_on_every_rank(TypeError, lambda: overlap.all_gather_matmul(ctx, bad, b), comm, "dtype")
    assert f"rank {comm.size - 1}" in msg


def test_unsupported_dtype(ctx, comm):
    a, b = operands(comm)
    bad_a = a.astype(np.int32) if last(comm) else a
    raised_on_every_rank(TypeError, lambda: overlap.matmul_reduce_scatter(ctx, bad_a, b), comm, "float32 or float64")
    bad_b = torch.from_numpy(b).to(torch.float16) if last(comm) else torch.from_numpy(b)
    raised_on_every_rank(TypeError, lambda: overlap.all_gather_matmul(ctx, torch.from_numpy(a), bad_b), comm,
                         "float32, float64 or bfloat16")
    raised_on_every_rank(TypeError, lambda: overlap.all_gather_matmul(ctx, "x" if last(comm) else a, b), comm,
                         "NumPy array or a torch tensor")


def test_shape_on_one_rank(ctx, comm):
    a, b = operands(comm)
    bad = b[:4] if last(comm) else b
    raised_on_every_rank(ValueError, lambda: overlap.all_gather_matmul(ctx, a, bad), comm, "K dimension")


def test_strides_on_one_rank(ctx, comm):
    a, b = operands(comm, m=6, k=6)
    bad = a[::2, ::2] if last(comm) else a[:3, :3]
    raised_on_every_rank(ValueError, lambda: overlap.all_gather_matmul(ctx, bad, b[:3]), comm, "row-major")


def test_options_on_one_rank(ctx, comm):
    a, b = operands(comm)
    raised_on_every_rank(ValueError, lambda: overlap.all_gather_matmul(
        ctx, a, b, strategy="sideways" if last(comm) else "ring"), comm, "strategy='sideways' must be one of")
    if comm.size > 1:  # options that disagree (at one rank there is nothing to disagree with)
        raised_on_every_rank(ValueError, lambda: overlap.matmul_reduce_scatter(
            ctx, a, b, strategy="bulk" if last(comm) else "ring"), comm, "strategy")


def test_transposed_on_some_ranks(ctx, comm):
    a, b = operands(comm)
    mine = a.T.copy().T if last(comm) else a
    if comm.size == 1:  # nothing to disagree with: the column-major operand is read transposed
        assert np.allclose(overlap.all_gather_matmul(ctx, mine, b), a @ b)
    else:
        raised_on_every_rank(ValueError, lambda: overlap.all_gather_matmul(ctx, mine, b), comm, "transpose")


def test_outputs(ctx, comm):
    a, b = operands(comm)
    ro = np.zeros((4 * comm.size, 3))
    ro.flags.writeable = not last(comm)
    raised_on_every_rank(ValueError, lambda: overlap.all_gather_matmul(ctx, a, b, ro), comm, "read-only")
    bias = np.zeros(2 if last(comm) else 3)
    raised_on_every_rank(ValueError, lambda: overlap.all_gather_matmul(ctx, a, b, bias=bias), comm, "bias")
    raised_on_every_rank(ValueError, lambda: overlap.all_gather_matmul(ctx, a, b, accumulate=True), comm,
                         "accumulate=True needs out")


def test_context_settings(comm):
    raised_on_every_rank(ValueError, lambda: overlap.Context(comm, ag_chunks=-1 if last(comm) else 2), comm,
                         "ag_chunks")
    raised_on_every_rank(ValueError, lambda: overlap.Context(comm, chunks=2), comm, "is not a setting")


def test_usable_after_errors(ctx, comm):
    a, b = operands(comm)
    with pytest.raises(ValueError):
        overlap.all_gather_matmul(ctx, a, b[:4] if last(comm) else b)
    c = overlap.all_gather_matmul(ctx, a, b, strategy="ring")
    A = np.concatenate(comm.allgather(a))
    assert np.allclose(c, A @ b)


def test_matmul_all_reduce_on_one_rank(ctx, comm):
    a, b = operands(comm)
    raised_on_every_rank(ValueError, lambda: overlap.matmul_all_reduce(
        ctx, a, b, reduced="diagonal" if last(comm) else "rows"), comm, "reduced='diagonal' must be one of")
    raised_on_every_rank(ValueError, lambda: overlap.matmul_all_reduce(ctx, a, b, algorithm="others"), comm,
                         "no other-operands algorithm")
    raised_on_every_rank(ValueError, lambda: overlap.matmul_all_reduce(
        ctx, a, b, bias=np.zeros(2 if last(comm) else 3)), comm, "bias")
    raised_on_every_rank(ValueError, lambda: overlap.matmul_all_reduce(
        ctx, a, b, np.zeros((4, 2) if last(comm) else (4, 3))), comm, "c.cols")
    if comm.size > 1:  # N must agree across ranks
        raised_on_every_rank(ValueError, lambda: overlap.matmul_all_reduce(
            ctx, a, b[:, :2] if last(comm) else b), comm, "(N)")
    assert np.allclose(overlap.matmul_all_reduce(ctx, a, b, strategy="ring"), comm.size * (a @ b))
