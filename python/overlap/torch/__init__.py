"""overlap.torch: tensor-parallel layers for PyTorch whose collectives
overlap their GEMMs (overlap's ops), and ``parallelize``, which puts them
into an existing model.

    model = MyTransformer()                          # plain torch, the same weights on every rank
    overlap.torch.parallelize(model, ctx, {"blocks.*.fc1": "column", "blocks.*.fc2": "row"})
    loss = model(x[overlap.torch.sequence_slice(len(x), ctx)]).sum()   # this rank's rows
    loss.backward()
    overlap.torch.allreduce_replicated_grads(model.parameters(), ctx)
    state = overlap.torch.gather_state_dict(model, ctx)   # the whole weights, on rank 0

layers.py has the layers (ColumnParallelLinear, RowParallelLinear),
moe.py the mixture-of-experts layer (ExpertParallelMLP), functions.py the
ops the linear layers run forward and backward, parallelize.py the
plan, state.py the state across the ranks, data_parallel.py the
data-parallel wrapper (DistributedDataParallel) (docs/python.md).
"""

from .data_parallel import DistributedDataParallel
from .layers import ColumnParallelLinear, RowParallelLinear, even_split
from .moe import ExpertParallelMLP
from .parallelize import parallelize, sequence_slice, transformer_plan
from .state import allreduce_replicated_grads, gather_grads, gather_state_dict

__all__ = [
    "ColumnParallelLinear",
    "DistributedDataParallel",
    "ExpertParallelMLP",
    "RowParallelLinear",
    "allreduce_replicated_grads",
    "even_split",
    "gather_grads",
    "gather_state_dict",
    "parallelize",
    "sequence_slice",
    "transformer_plan",
]
