"""DistributedDataParallel: a module's gradients averaged over the
data-parallel ranks while autograd's backward still runs, as torch's DDP
does, on overlap's own rings (overlap._core.GradientReducer) over MPI.

    dp = MPI.COMM_WORLD.Split(color=rank % tp)        # the ranks holding the same shards
    model = DistributedDataParallel(parallelized_model, dp, bucket_cap_mb=25)
    loss = model(x).sum(); loss.backward()              # model's .grad: averaged over dp
    optimizer.step()

The parameters are cut into buckets of at most bucket_cap_mb, in the
reverse of the module's parameter order (about the order backward makes
their gradients). As soon as autograd has accumulated every gradient of a
bucket, the bucket is copied into a flat buffer and its ring all-reduce is
queued: a thread of the reducer's own runs it while the backward goes on
with earlier layers. At the end of the backward (an autograd callback) the
buckets still waiting are queued, every ring is waited for, and each .grad
becomes the average over the ranks.

A parameter the forward did not use would hold its bucket, and every
bucket after it, until the end of the backward. So forward() walks the
autograd graph from its outputs (as torch's DDP with
find_unused_parameters=True does) and the first hook of the backward counts
the parameters it did not reach as done.

Each bucket carries one more element per parameter: 1 where this rank has a
gradient for it. A parameter no rank used keeps its .grad (None stays
None); one that some ranks used gets the average over all ranks, the others
counting zero, as torch's DDP with find_unused_parameters=True does.
"""

import contextlib

import torch

import overlap

_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


def _tensors(out):
    """The tensors in a module's output (nested tuples, lists and dicts)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (list, tuple)):
        for o in out:
            yield from _tensors(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from _tensors(o)


def _reached(out):
    """ids of the leaf tensors (parameters) whose gradients a backward from
    out can reach."""
    stack = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
    seen, found = set(), set()
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        leaf = getattr(fn, "variable", None)  # AccumulateGrad's parameter
        if leaf is not None:
            found.add(id(leaf))
        stack.extend(n for n, _ in fn.next_functions if n is not None)
    return found


class _Bucket:
    """A run of parameters of one dtype whose gradients are summed as one
    buffer: their values, then one used-flag per parameter."""

    def __init__(self, params, dtype):
        self.params = params
        self.offsets, at = [], 0
        for p in params:
            self.offsets.append(at)
            at += p.numel()
        self.flat = torch.zeros(at + len(params), dtype=dtype)
        self.reducer = None  # the reducer of its dtype
        self.missing = len(params)  # gradients not yet accumulated in this backward
        self.ticket = None  # the reducer's ticket once queued

    def pack(self):
        """Copies the gradients (zero where none) and the used flags in."""
        n = len(self.params)
        flags = self.flat[len(self.flat) - n:]
        for i, (p, at) in enumerate(zip(self.params, self.offsets)):
            view = self.flat[at:at + p.numel()]
            if p.grad is None:
                view.zero_()
                flags[i] = 0
            else:
                view.copy_(p.grad.detach().reshape(-1))
                flags[i] = 1

    def unpack(self, ranks):
        """Sets each used parameter's .grad to the sum over the ranks / ranks."""
        n = len(self.params)
        flags = self.flat[len(self.flat) - n:]
        for i, (p, at) in enumerate(zip(self.params, self.offsets)):
            if flags[i].item() == 0:
                continue  # no rank has a gradient for it
            mean = self.flat[at:at + p.numel()].view_as(p).div(ranks)
            if p.grad is None:
                p.grad = mean
            else:
                p.grad.detach().copy_(mean)


class DistributedDataParallel(torch.nn.Module):
    """Wraps ``module`` (the same model on every rank of ``comm``, an mpi4py
    communicator: the data-parallel ranks) so that the backward pass
    averages its gradients over ``comm``, overlapped with the backward.

    Collective over comm: every rank must wrap a module with the same
    parameters and buffers (shapes, dtypes, order, which parameters are
    trained) and the same bucket_cap_mb, or every
    rank raises (ValueError; TypeError for a parameter that is not a CPU
    float32 or float64 tensor). The parameters and buffers are then made
    rank 0's (broadcast). ``settings`` go to the overlap.Context it opens
    on comm (timeout_s bounds each ring step, progress="poll" keeps the
    rings off a thread). ``thread=False`` advances the rings only in the
    backward's hooks and its final wait.

    Every rank must run the same number of backward passes through the
    wrapper with gradients for at least one parameter, as with torch's DDP.
    Not for several threads at once.
    """

    def __init__(self, module, comm, bucket_cap_mb=25.0, thread=True, **settings):
        super().__init__()
        self.module = module
        self.comm = comm
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._agree(bucket_cap_mb)
        self._ctx = overlap.Context(comm, **settings)
        self._broadcast_state()
        self._buckets = self._make_buckets(int(bucket_cap_mb * 2**20))
        reducers = {}
        for b in self._buckets:  # every rank makes the same reducers in the same order (agreed above)
            if b.flat.dtype not in reducers:
                reducers[b.flat.dtype] = overlap._core.GradientReducer(self._ctx, _DTYPES[b.flat.dtype],
                                                                        2**62, thread=thread)
            b.reducer = reducers[b.flat.dtype]
        self._reducers = list(reducers.values())
        self._where = {}  # id(param) -> its bucket
        for b in self._buckets:
            for p in b.params:
                self._where[id(p)] = b
        self._sync = True
        self._armed = False  # the end-of-backward callback is queued
        self._next = 0  # the next bucket to queue (they are queued in order on every rank)
        self._unreached = []  # parameters the last forward's graph does not reach
        self.queued_in_backward = 0  # buckets the last backward queued from its hooks, before its end
        self._accumulators = []  # autograd's AccumulateGrad nodes, kept so that their hooks live
        for p in self._params:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._hook_for(p))
            self._accumulators.append(acc)

    # ------------------------------------------------------------ set-up

    def _agree(self, bucket_cap_mb):
        """Raises on every rank unless every rank's parameters and bucket
        size are the same and supported."""
        # Every parameter and buffer (the broadcast covers them all), and
        # which parameters are trained.
        state = list(self.module.parameters()) + list(self.module.buffers())
        mine = (float(bucket_cap_mb), [(tuple(t.shape), str(t.dtype), t.device.type, t.requires_grad) for t in state])
        problem = None
        if not bucket_cap_mb > 0:
            problem = (ValueError, f"bucket_cap_mb={bucket_cap_mb} must be > 0")
        for p in self._params:
            if p.dtype not in _DTYPES or p.device.type != "cpu":
                problem = problem or (TypeError, f"a parameter is {p.dtype} on {p.device.type}: DistributedDataParallel "
                                                 "sums CPU float32 and float64 gradients")
        everyone = self.comm.allgather((mine, problem))
        for r, (_, prob) in enumerate(everyone):
            if prob is not None:
                raise prob[0](f"overlap.torch.DistributedDataParallel: rank {r}: {prob[1]}")
        for r, (theirs, _) in enumerate(everyone):
            if theirs != everyone[0][0]:
                what = ("bucket_cap_mb" if theirs[0] != everyone[0][0][0] else
                        "parameters or buffers (shapes, dtypes, order or requires_grad)")
                raise ValueError(f"overlap.torch.DistributedDataParallel: rank {r}'s {what} differ from rank 0's")

    def _broadcast_state(self):
        """Rank 0's parameters and buffers, on every rank (as torch's DDP)."""
        with torch.no_grad():
            for t in list(self.module.parameters()) + list(self.module.buffers()):
                if t.numel() == 0:
                    continue
                flat = t.detach().contiguous()
                self.comm.Bcast(flat.view(-1).view(torch.uint8).numpy(), root=0)
                if flat.data_ptr() != t.data_ptr():
                    t.copy_(flat)

    def _make_buckets(self, cap):
        buckets, run, size = [], [], 0
        for p in reversed(self._params):
            nbytes = p.numel() * p.element_size()
            if run and (run[0].dtype != p.dtype or size + nbytes > cap):
                buckets.append(_Bucket(run, run[0].dtype))
                run, size = [], 0
            run.append(p)
            size += nbytes
        if run:
            buckets.append(_Bucket(run, run[0].dtype))
        return buckets

    # ------------------------------------------------------------ the backward

    def _hook_for(self, p):
        def hook(*_):
            if not self._sync:
                return
            if not self._armed:
                self._armed = True
                self.queued_in_backward = 0
                torch.autograd.Variable._execution_engine.queue_callback(self._finish)
                for q in self._unreached:
                    self._where[id(q)].missing -= 1
            self._where[id(p)].missing -= 1
            while self._next < len(self._buckets) and self._buckets[self._next].missing == 0:
                self._queue(self._buckets[self._next])
                self.queued_in_backward += 1
            for r in self._reducers:
                r.poll()

        return hook

    def _queue(self, b):
        b.pack()
        b.ticket = b.reducer.all_reduce(b.flat.numpy())
        self._next += 1

    def _finish(self):
        """The end of the backward: the rest queued, all waited for, the
        averages written back."""
        try:
            while self._next < len(self._buckets):  # parameters this backward gave no gradient
                self._queue(self._buckets[self._next])
            for b in self._buckets:
                b.reducer.wait(b.ticket)
            ranks = self.comm.size
            with torch.no_grad():
                for b in self._buckets:
                    b.unpack(ranks)
        finally:
            self._armed = False
            self._next = 0
            for b in self._buckets:
                b.missing, b.ticket = len(b.params), None

    # ------------------------------------------------------------ the module

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if self._sync and torch.is_grad_enabled():
            reached = _reached(out)
            self._unreached = [p for p in self._params if id(p) not in reached]
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate this rank's gradients without
        averaging them; the first backward after it averages the sums."""
        was, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = was

    @property
    def threaded(self):
        """True when a thread of overlap's own advances the rings."""
        return all(r.threaded for r in self._reducers)

    def close(self):
        """Releases the rings and the context. Local."""
        self._reducers = []
        for b in self._buckets:
            b.reducer = None
        self._ctx.close()
