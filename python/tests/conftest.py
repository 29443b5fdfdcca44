"""Fixtures of the Python suite. It runs under mpirun (1-3 ranks): every
rank runs every test, and a test makes the same collective calls on every
rank, checking its results after them (a rank that failed early would
leave the others waiting)."""

import numpy as np
import pytest
from mpi4py import MPI

import overlap


@pytest.fixture(scope="session")
def comm():
    return MPI.COMM_WORLD


@pytest.fixture(scope="session")
def ctx(comm):
    with overlap.Context(comm) as c:
        yield c


def shard_sizes(total, ranks, uneven=True):
    """Shard sizes over the ranks: uneven (rank 1 empty when there are 3 or
    more ranks) or even."""
    if not uneven or ranks == 1:
        return [total // ranks + (1 if r < total % ranks else 0) for r in range(ranks)]
    sizes = [total // ranks] * ranks
    sizes[0] += total - sum(sizes)
    if ranks >= 3:
        sizes[0] += sizes[1]
        sizes[1] = 0
    return sizes


def split(x, sizes, rank, axis):
    lo = sum(sizes[:rank])
    return np.take(x, range(lo, lo + sizes[rank]), axis=axis)


def rng_for(seed):
    """The same random numbers on every rank."""
    return np.random.default_rng(seed)
