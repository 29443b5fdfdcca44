"""overlap: tensor-parallel matrix products whose communication hides behind
their computation, on CPU clusters (MPI through mpi4py).

Every op is collective over a Context: every rank calls it with the same
options; shards may differ in size (zero included). Arrays are NumPy arrays
(float32, float64) or torch tensors (float32, float64, bfloat16) on the CPU,
2-D and row-major with a row stride, or the transpose of such an array
(``w.T``: read transposed, without a copy). They are used in place. Outputs
are allocated when not given (of the first operand's kind and dtype); an
output split across ranks is then split evenly.

Bad input on any rank raises ValueError (TypeError for a wrong type or
dtype) on every rank, before any rank starts. The GIL is released while an
op runs.

    from mpi4py import MPI
    import numpy as np, overlap

    ctx = overlap.Context(MPI.COMM_WORLD)
    x = np.random.rand(128, 512).astype(np.float32)   # this rank's rows
    w = np.random.rand(512, 256).astype(np.float32)   # this rank's columns
    y = overlap.all_gather_matmul(ctx, x, w)          # all rows x its columns
"""

import atexit as _atexit
import weakref as _weakref

from mpi4py import MPI as _MPI  # initialises MPI (MPI_THREAD_MULTIPLE) before any context

from . import _core
from ._core import Error, ExpertCounts, Pending

__version__ = _core.__version__

__all__ = [
    "Context",
    "Error",
    "ExpertCounts",
    "Pending",
    "all_gather_matmul",
    "all_to_all_matmul",
    "exchange_expert_counts",
    "matmul_all_reduce",
    "matmul_all_to_all",
    "matmul_reduce_scatter",
    "start_all_gather_matmul",
    "start_all_to_all_matmul",
    "start_matmul_all_reduce",
    "start_matmul_all_to_all",
    "start_matmul_reduce_scatter",
    "schedule_of",
]

_open = _weakref.WeakSet()


class Context(_core.Context):
    """Context(comm=None, **settings): an overlap context on a duplicate of
    the mpi4py communicator ``comm`` (MPI.COMM_WORLD when None).

    Collective over comm. ``settings`` are the fields of overlap::config
    (``progress="poll"``, ``timeout_s=60``, ``ag_chunks=4``, ...), written as
    the OVERLAP_* variables are, and laid over them: the environment applies
    as it does in C++, and an explicit setting wins. A bad setting on any
    rank raises ValueError on every rank.

    ``ctx.comm`` is ``comm``. Close it (``close()`` or a ``with`` block) before MPI is finalised; the
    contexts still open when Python exits are closed before mpi4py finalises
    MPI.
    """

    def __init__(self, comm=None, **settings):
        super().__init__(comm, **settings)
        #: The mpi4py communicator the context was made on (not its duplicate):
        #: overlap.torch's collectives outside the ops (agreement, state) use it.
        self.comm = _MPI.COMM_WORLD if comm is None else comm
        _open.add(self)


@_atexit.register
def _close_open_contexts():
    # atexit runs last-registered first: this runs before mpi4py's finalize.
    for ctx in list(_open):
        if not ctx.closed:
            ctx.close()


def all_gather_matmul(ctx, a, b, out=None, *, gathered="lhs_rows", strategy="automatic", bias=None,
                      activation=None, accumulate=False, gathered_out=None, algorithm="automatic"):
    """out = a @ b with the operand named by ``gathered`` sharded over the
    ranks and all-gathered while the partial products compute.

    gathered: ``lhs_rows`` (a is this rank's rows of A: out is M x N_local),
    ``lhs_cols`` (a is this rank's columns of A, b the matching rows),
    ``rhs_rows`` or ``rhs_cols`` (the same for b). strategy: ``automatic``,
    ``bulk``, ``ring``, ``bidirectional`` or ``hierarchical``. bias (one value
    per output column) and activation (``relu``, ``gelu``) apply after the
    product; accumulate=True adds into ``out``.

    gathered_out: an array that receives the gathered operand (laid out as
    the sharded operand is), or True to allocate it: the call then returns
    ``(out, gathered)``.

    Several products of one gather: pass a list as the other operand
    (``all_gather_matmul(ctx, x, [wq, wk, wv])``, or a list as ``a`` for
    ``rhs_*``); returns a list.
    """
    return _core.all_gather_matmul(ctx, a, b, out, gathered=gathered, strategy=strategy, algorithm=algorithm,
                                   bias=bias, activation=activation, accumulate=accumulate,
                                   gathered_out=gathered_out)


def matmul_reduce_scatter(ctx, a, b, out=None, *, scattered="rows", strategy="automatic", bias=None,
                          activation=None, accumulate=False, bf16_transfers=False, algorithm="automatic"):
    """out = this rank's shard of the sum over ranks of a @ b (a is M x K_r,
    b is K_r x N), the partial sums reduced round the ring while the next
    piece computes. scattered: ``rows`` (out is M_r x N) or ``cols``
    (M x N_r); without ``out`` the split is even. bias and activation apply
    once, after the sum."""
    return _core.matmul_reduce_scatter(ctx, a, b, out, scattered=scattered, strategy=strategy, algorithm=algorithm,
                                       bias=bias, activation=activation, accumulate=accumulate,
                                       bf16_transfers=bf16_transfers)


def matmul_all_reduce(ctx, a, b, out=None, *, reduced="rows", strategy="automatic", bias=None, activation=None,
                      accumulate=False, bf16_transfers=False, algorithm="automatic"):
    """out = the sum over ranks of a @ b (a is M x K_r, b is K_r x N), the
    whole M x N on every rank: the row-parallel linear layer without
    sequence parallelism. Groups of the sum's rows (``reduced="rows"``) or
    columns (``"cols"``) are reduce-scattered round the ring while the next
    pieces compute, then all-gathered while the next group's ring runs;
    ``bulk`` is one GEMM and an all-reduce. bias (N values) and activation
    apply once, after the sum. algorithm: ``automatic`` or ``named`` (there
    is no other-operands algorithm)."""
    return _core.matmul_all_reduce(ctx, a, b, out, reduced=reduced, strategy=strategy, algorithm=algorithm,
                                   bias=bias, activation=activation, accumulate=accumulate,
                                   bf16_transfers=bf16_transfers)


def start_all_gather_matmul(ctx, a, b, out=None, **options):
    """all_gather_matmul, started: the checks and agreement happen here; the
    op then runs on the context's worker thread. Returns a Pending whose
    ``wait()`` returns the output (``test()`` asks without blocking). The
    arrays must not change until then; one started op per context."""
    return _core.start_all_gather_matmul(ctx, a, b, out, **options)


def start_matmul_reduce_scatter(ctx, a, b, out=None, **options):
    """matmul_reduce_scatter, started (see start_all_gather_matmul)."""
    return _core.start_matmul_reduce_scatter(ctx, a, b, out, **options)


def start_matmul_all_reduce(ctx, a, b, out=None, **options):
    """matmul_all_reduce, started (see start_all_gather_matmul)."""
    return _core.start_matmul_all_reduce(ctx, a, b, out, **options)


def schedule_of(ctx, op, a, b, out=None, **options):
    """The schedule ``op`` ("all_gather_matmul", "matmul_reduce_scatter" or
    "matmul_all_reduce") runs for these arguments, as a dict: strategy,
    algorithm, lanes, chunks (matmul_all_reduce's ring: its groups), by_model,
    predicted_s, candidates (each with its predicted_s) and text.
    Collective, as the call; builds and caches the plan without computing."""
    ops = {"all_gather_matmul": _core.all_gather_matmul_schedule,
           "matmul_reduce_scatter": _core.matmul_reduce_scatter_schedule,
           "matmul_all_reduce": _core.matmul_all_reduce_schedule}
    if op not in ops:
        raise ValueError(f"schedule_of: op must be one of {', '.join(ops)} (got {op!r})")
    return ops[op](ctx, a, b, out, **options)


# ------------------------------------------- the token exchange (mixture of experts)


def exchange_expert_counts(ctx, experts, send):
    """The routing of a mixture-of-experts layer as an ExpertCounts:
    ``send`` (any sequence of R * experts integers, rank-major) holds the
    rows this rank sends to each (rank, local expert); ``recv`` comes from
    the other ranks. Collective; experts must agree across ranks."""
    return _core.exchange_expert_counts(ctx, experts, send)


def all_to_all_matmul(ctx, x, w, counts, out=None, *, strategy="automatic", transpose_w=False,
                      dispatched_out=None):
    """Dispatch, then each local expert's product: out = the rows every rank
    sends to this rank's experts, each times its expert's weight.

    x (counts.sent_rows x K): this rank's token rows grouped by destination
    rank, then by that rank's local expert (counts.send rows each). w
    (E * K x N): this rank's E experts' weights stacked (with
    transpose_w=True, E * N x K, each read transposed). out
    (counts.received_rows x N) is ordered by source rank, then local expert,
    each block in the order its sender sent it (MPI_Alltoallv's order).
    strategy: ``automatic``, ``bulk`` or ``pairwise``. dispatched_out: an
    array for the received rows themselves (in out's order), or True to
    allocate it: the call then returns ``(out, dispatched)``. Collective;
    counts that disagree with a peer's raise ValueError on every rank."""
    return _core.all_to_all_matmul(ctx, x, w, counts, out, strategy=strategy, transpose_w=transpose_w,
                                   dispatched_out=dispatched_out)


def matmul_all_to_all(ctx, h, w, counts, out=None, *, strategy="automatic", transpose_w=False):
    """The local experts' product, then combine: h (counts.received_rows x
    F, in all_to_all_matmul's output order) times each row's expert weight
    (w: E * F x K stacked; E * K x F with transpose_w), returned to the
    ranks the rows came from. out (counts.sent_rows x K) is in the order of
    the x that all_to_all_matmul dispatched. Collective."""
    return _core.matmul_all_to_all(ctx, h, w, counts, out, strategy=strategy, transpose_w=transpose_w)


def start_all_to_all_matmul(ctx, x, w, counts, out=None, **options):
    """all_to_all_matmul, started (see start_all_gather_matmul)."""
    return _core.start_all_to_all_matmul(ctx, x, w, counts, out, **options)


def start_matmul_all_to_all(ctx, h, w, counts, out=None, **options):
    """matmul_all_to_all, started (see start_all_gather_matmul)."""
    return _core.start_matmul_all_to_all(ctx, h, w, counts, out, **options)
