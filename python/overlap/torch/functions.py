"""The autograd functions behind overlap.torch's layers: which op runs
forward and which backward, and how a layer's activation is fused.

An activation runs as the op's fused epilogue (oneDNN's post-op, after the
bias and after the last accumulation). Its backward needs:

- relu: the sign of its input, which its output has (y > 0 exactly where
  the product was): the op's output is kept;
- gelu: its input, which the fused epilogue does not keep. When a gradient
  will be asked for, the op fuses the bias only and the layer applies GELU
  to the product, keeping the product for the backward (as torch's F.gelu
  keeps its input); without one (inference, torch.no_grad) GELU is fused.
  Recomputing the product in the backward instead would cost one more GEMM
  of the forward's size: more than the elementwise pass it saves.
"""

import math

import torch
import torch.nn.functional as F

import overlap

ACTIVATIONS = ("relu", "gelu")


def checked_activation(name):
    """``name`` as the ops spell it (None for none), or ValueError."""
    if name is None or name == "none":
        return None
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be None, 'relu' or 'gelu' (got {name!r})")
    return name


def rows_of(t):
    """t as a 2-D row-major matrix of its last dimension (a view when it can be).
    The row count is spelled out: with no features (an empty shard) -1 is ambiguous."""
    t = t.reshape(math.prod(t.shape[:-1]), t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def joined(ts, dim):
    """The tensors side by side along ``dim``: the one itself when there is one
    (torch.cat would copy it, a weight's worth on every backward step)."""
    return ts[0] if len(ts) == 1 else torch.cat(ts, dim)


def _gelu_grad(x):
    """d/dx of x * Phi(x) (exact GELU, as oneDNN's gelu_erf and torch's F.gelu)."""
    w = x.float() if x.dtype == torch.bfloat16 else x
    cdf = 0.5 * (1.0 + torch.erf(w * (1.0 / math.sqrt(2.0))))
    pdf = torch.exp(-0.5 * w * w) * (1.0 / math.sqrt(2.0 * math.pi))
    return (cdf + w * pdf).to(x.dtype)


class Activation:
    """How one call runs its activation: ``fused`` is what the op applies,
    ``after`` finishes the op's output, ``grad`` takes the output's gradient
    back to the product's."""

    def __init__(self, name, needs_grad):
        self.name = name
        self.keeps_product = name == "gelu" and needs_grad

    @property
    def fused(self):
        return None if self.keeps_product else self.name

    def after(self, out):
        """(the layer's output, what its backward keeps) from the op's output."""
        if self.keeps_product:
            return F.gelu(out), out
        return out, (out if self.name == "relu" else None)

    def grad(self, dy, kept):
        if self.name is None:
            return dy
        if self.name == "relu":
            return dy * (kept > 0).to(dy.dtype)
        return dy * _gelu_grad(kept)


def needs_grad(*tensors):
    """Whether autograd will ask this call for a gradient."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class Column(torch.autograd.Function):
    """y = act(AG(x) @ w.T + b); backward: dx = RS(dp @ w) started, dw from
    the gathered input meanwhile (dp: y's gradient through the activation)."""

    @staticmethod
    def forward(fctx, x, w, b, octx, strategy, act):
        y, gathered = overlap.all_gather_matmul(octx, x, w.t(), bias=b, activation=act.fused, strategy=strategy,
                                                gathered_out=True)
        y, kept = act.after(y)
        fctx.save_for_backward(gathered, w, kept)
        fctx.octx, fctx.strategy, fctx.has_bias, fctx.rows, fctx.act = octx, strategy, b is not None, x.shape[0], act
        return y

    @staticmethod
    def backward(fctx, dy):
        gathered, w, kept = fctx.saved_tensors
        dp = rows_of(fctx.act.grad(dy, kept))
        dx = torch.empty((fctx.rows, w.shape[1]), dtype=dp.dtype)
        pending = overlap.start_matmul_reduce_scatter(fctx.octx, dp, w, dx, strategy=fctx.strategy)
        dw = dp.t().mm(gathered)  # computed while the reduce-scatter runs
        db = dp.sum(0) if fctx.has_bias else None
        pending.wait()
        return dx, dw, db, None, None, None


class FusedColumn(torch.autograd.Function):
    """ys[i] = AG(x) @ ws[i].T with one gather (the several-products form);
    backward: dx = RS(cat(dys) @ cat(ws)), and the weight gradients
    dws[i].T = AG(x).T @ dys[i] as one all_gather_matmul of x.T (lhs_cols)."""

    @staticmethod
    def forward(fctx, octx, strategy, x, *ws):
        ys = overlap.all_gather_matmul(octx, x, [w.t() for w in ws], strategy=strategy)
        fctx.save_for_backward(x, *ws)
        fctx.octx, fctx.strategy = octx, strategy
        return tuple(ys)

    @staticmethod
    def backward(fctx, *dys):
        x, *ws = fctx.saved_tensors
        dys = [rows_of(d) for d in dys]
        dx = torch.empty_like(x)
        overlap.matmul_reduce_scatter(fctx.octx, joined(dys, 1), joined(ws, 0), dx, strategy=fctx.strategy)
        dwts = overlap.all_gather_matmul(fctx.octx, x.t(), dys, gathered="lhs_cols", strategy=fctx.strategy)
        return (None, None, dx, *[d.t() for d in dwts])


class LocalColumn(torch.autograd.Function):
    """ys[i] = x @ ws[i].T on every row (no sequence parallelism); backward:
    dx = AR(cat(dys) @ cat(ws)) started, the weight gradients meanwhile."""

    @staticmethod
    def forward(fctx, octx, strategy, x, *ws):
        fctx.save_for_backward(x, *ws)
        fctx.octx, fctx.strategy = octx, strategy
        return tuple(x.mm(w.t()) for w in ws)

    @staticmethod
    def backward(fctx, *dys):
        x, *ws = fctx.saved_tensors
        dys = [rows_of(d) for d in dys]
        dx = torch.empty_like(x)
        pending = overlap.start_matmul_all_reduce(fctx.octx, joined(dys, 1), joined(ws, 0), dx,
                                                  strategy=fctx.strategy)
        dws = [d.t().mm(x) for d in dys]  # computed while the all-reduce runs
        pending.wait()
        return (None, None, dx, *dws)


class AllReducedRow(torch.autograd.Function):
    """z = act(AR(y @ w.T) + b), whole on every rank (no sequence
    parallelism); backward: dy = dp @ w and dw = dp.T @ y, local."""

    @staticmethod
    def forward(fctx, y, w, b, octx, strategy, act):
        z = overlap.matmul_all_reduce(octx, y, w.t(), bias=b, activation=act.fused, strategy=strategy)
        z, kept = act.after(z)
        fctx.save_for_backward(y, w, kept)
        fctx.has_bias, fctx.act = b is not None, act
        return z

    @staticmethod
    def backward(fctx, dz):
        y, w, kept = fctx.saved_tensors
        dp = rows_of(fctx.act.grad(dz, kept))
        db = dp.sum(0) if fctx.has_bias else None  # whole: dz is the same on every rank
        return dp.mm(w), dp.t().mm(y), db, None, None, None


class Row(torch.autograd.Function):
    """z = act(RS(y @ w.T) + b) (this rank's rows); backward: dy = AG(dp) @ w,
    keeping AG(dp) for dw."""

    @staticmethod
    def forward(fctx, y, w, b, octx, strategy, rows, act):
        z = torch.empty((rows, w.shape[0]), dtype=y.dtype)
        overlap.matmul_reduce_scatter(octx, y, w.t(), z, bias=b, activation=act.fused, strategy=strategy)
        z, kept = act.after(z)
        fctx.save_for_backward(y, w, kept)
        fctx.octx, fctx.strategy, fctx.has_bias, fctx.act = octx, strategy, b is not None, act
        return z

    @staticmethod
    def backward(fctx, dz):
        y, w, kept = fctx.saved_tensors
        dp = rows_of(fctx.act.grad(dz, kept))
        dy, gathered = overlap.all_gather_matmul(fctx.octx, dp, w, strategy=fctx.strategy, gathered_out=True)
        dw = gathered.t().mm(y)
        db = dp.sum(0) if fctx.has_bias else None  # partial: summed over ranks by allreduce_replicated_grads
        return dy, dw, db, None, None, None, None
