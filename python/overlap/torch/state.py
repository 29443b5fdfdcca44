"""A parallel model's state across the ranks: its whole state dict (or its
gradients) brought to rank 0, and the replicated parameters' partial
gradients summed."""

import collections

import torch

from .layers import ColumnParallelLinear, RowParallelLinear


def _whole(parts, dim, blocks):
    """The whole tensor from every rank's block along dim; each block is
    ``blocks`` equal parts (parallelize's ``parts``), joined part by part."""
    if blocks == 1:
        return torch.cat(parts, dim)
    split = [p.chunk(blocks, dim) for p in parts]
    return torch.cat([torch.cat([s[i] for s in split], dim) for i in range(blocks)], dim)


def _gathered(model, ctx, values):
    """{name: tensor} on rank 0 (None elsewhere): ``values`` (the model's
    local {name: tensor}) with every parallel layer's split tensors made
    whole. Collective over ctx."""
    split = {}
    for prefix, m in model.named_modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
            for name, dim in m.sharded():
                split[f"{prefix}.{name}" if prefix else name] = (dim, m.parts)
    out = collections.OrderedDict() if ctx.rank == 0 else None
    for key, t in values.items():
        if key in split:  # every rank gathers, whether or not it has the tensor
            parts = ctx.comm.gather(None if t is None else t.detach(), root=0)
            if out is not None:
                out[key] = None if any(p is None for p in parts) else _whole(parts, *split[key])
        elif out is not None:
            out[key] = t
    return out


def gather_state_dict(model, ctx):
    """The model's whole state dict on rank 0 (None on the other ranks): the
    parallel layers' blocks joined into the weights of the model before
    ``parallelize``, under its names, so that the unparallelized model (or
    a later parallelize of it) loads it. Collective over ctx."""
    return _gathered(model, ctx, model.state_dict())


def gather_grads(model, ctx):
    """{parameter name: whole gradient} on rank 0 (None elsewhere), joined
    as gather_state_dict joins the weights; a parameter without a gradient
    maps to None. Collective over ctx."""
    return _gathered(model, ctx, collections.OrderedDict((n, p.grad) for n, p in model.named_parameters()))


def allreduce_replicated_grads(params, comm):
    """Sums the gradients of the parameters of ``params`` marked
    ``sequence_parallel`` over the ranks of ``comm`` (an mpi4py
    communicator, or an overlap Context: its ``comm``), in place, in one
    message: in float64 when any gradient is float64, else in float32
    (bfloat16 gradients are summed widened)."""
    from mpi4py import MPI

    comm = getattr(comm, "comm", comm)
    grads = [p.grad for p in params if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not grads or comm.size == 1:
        return
    wide = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    flat = torch.cat([g.reshape(-1).to(wide) for g in grads])
    comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
    at = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[at:at + n].view_as(g))
        at += n
