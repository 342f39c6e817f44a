"""The fused optimizers (``torch.optim.Adam/AdamW/SGD(fused=True)``; fused AdamW is what Hugging Face's Trainer picks by
default): one op per step over every parameter, so one op-table entry and one fragment instead of a dozen ``_foreach_*``
calls, and no CPU fallback. The learning rate and the other float hyper-parameters are runtime values (csrc/executor/
kernel.cpp ``floats_at_run_time``): a schedule changes them every step without a new lowering or compile.

Semantics follow PyTorch's CPU kernel (aten/src/ATen/native/cpu/FusedAdamKernel.cpp): grads divided by
``grad_scale`` (and written back unscaled), no update at all where ``found_inf`` is set, math in float32 for
half-precision tensors (SGD: aten/src/ATen/native/cpu/FusedSGDKernel.cpp, the same grad_scale and found_inf). The bias
corrections use the device's step counters (``1 - beta**step`` as
``-expm1(step * log(beta))``, accurate in float32 where ``1 - beta2**step`` is not for small steps)."""

from __future__ import annotations

import math

import torch

from .. import emit as E
from ..hlo import Value
from ..tables import META, inplace_lowering
from ..trace import plain


def _step_inputs(tr, fn, lr, grad_scale, found_inf):
    """The learning rate (a runtime scalar, or the .tensor_lr overload's tensor), GradScaler's scale, and the
    predicate that skips the whole step (found_inf set)."""
    f32 = torch.float32
    lr_v = E.convert(E.reshape(lr, ()), f32) if isinstance(lr, Value) else tr.scalar(lr, f32)
    scale = E.convert(E.reshape(grad_scale, ()), f32) if grad_scale is not None else None
    skip = None
    if found_inf is not None:
        skip = E.compare(E.convert(E.reshape(found_inf, ()), f32), E.const(fn, 0.0, f32), "NE")
    return lr_v, scale, skip


def _acc(p):
    """The dtype a parameter's update is computed in, and a broadcast of a scalar over it in that dtype."""
    acc = torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype
    return acc, lambda v: E.broadcast_to(E.convert(v, acc), p.shape)


def _written(tr, outs, skip):
    """[(old, new)] with the parameter first: each new value in its tensor's dtype (the old one where the step is
    skipped); the parameter's is returned, the others update their tensors."""
    result = None
    for j, (old, new) in enumerate(outs):
        new = E.convert(new, old.dtype)
        if skip is not None:
            new = E.select(E.broadcast_to(skip, old.shape), old, new)
        if j == 0:
            result = new
        else:
            tr.update(old, new)
    return result


def _adam(
    tr,
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    max_exp_avg_sqs,
    state_steps,
    lr,
    beta1,
    beta2,
    weight_decay,
    eps,
    amsgrad,
    maximize,
    grad_scale,
    found_inf,
    decoupled,
):
    f32 = torch.float32
    if not params:
        return ()
    fn = params[0].fn
    lr_v, scale, skip = _step_inputs(tr, fn, lr, grad_scale, found_inf)
    eps_v = tr.scalar(eps, f32)
    # the betas shape the bias corrections' logarithms, taken on the host in double (keyed by value: they are
    # constants of a run, where the learning rate is not)
    b1, b2 = float(beta1), float(beta2)
    one = E.const(fn, 1.0, f32)
    wd = plain(weight_decay)
    wd_v = tr.scalar(weight_decay, f32) if wd != 0 else None
    new_params = []
    for i, p in enumerate(params):
        shape = p.shape
        acc, S = _acc(p)
        pv, g, m, v = (E.convert(x, acc) for x in (p, grads[i], exp_avgs[i], exp_avg_sqs[i]))
        if scale is not None:
            g = E.div(g, S(scale))
            gstore = g
        if maximize:
            g = E.unary("negate", g)
        if wd_v is not None:
            if decoupled:
                pv = E.mul(pv, S(E.sub(one, E.mul(lr_v, wd_v))))
            else:
                g = E.add(g, E.mul(pv, S(wd_v)))
        m = E.add(m, E.mul(E.sub(g, m), E.const(fn, 1 - b1, acc, shape)))
        v = E.add(E.mul(v, E.const(fn, b2, acc, shape)), E.mul(E.mul(g, g), E.const(fn, 1 - b2, acc, shape)))
        step = E.convert(E.reshape(state_steps[i], ()), f32)
        bc1 = E.unary("negate", E.unary("exponential_minus_one", E.mul(step, E.const(fn, math.log(b1), f32))))
        bc2 = E.unary("negate", E.unary("exponential_minus_one", E.mul(step, E.const(fn, math.log(b2), f32))))
        step_size = E.div(lr_v, bc1)
        vmax = v
        if amsgrad:
            vmax = E.maximum(E.convert(max_exp_avg_sqs[i], acc), v)
        denom = E.add(E.div(E.unary("sqrt", vmax), S(E.unary("sqrt", bc2))), S(eps_v))
        pv = E.sub(pv, E.mul(S(step_size), E.div(m, denom)))
        outs = [(p, pv), (exp_avgs[i], m), (exp_avg_sqs[i], v)]
        if amsgrad:
            outs.append((max_exp_avg_sqs[i], vmax))
        if scale is not None:
            outs.append((grads[i], gstore))
        new_params.append(_written(tr, outs, skip))
    return tuple(new_params)


def _register(name, decoupled):
    def rule(
        tr,
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        state_steps,
        *,
        lr,
        beta1,
        beta2,
        weight_decay,
        eps,
        amsgrad,
        maximize,
        grad_scale=None,
        found_inf=None,
    ):
        return _adam(
            tr,
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            max_exp_avg_sqs,
            state_steps,
            lr,
            beta1,
            beta2,
            weight_decay,
            eps,
            amsgrad,
            maximize,
            grad_scale,
            found_inf,
            decoupled,
        )

    rule.__name__ = name
    inplace_lowering(name)(rule)
    inplace_lowering(f"{name}.tensor_lr")(rule)
    META[f"{name}.tensor_lr"] = lambda *args, **kwargs: None  # PyTorch has no meta kernel for it; it returns nothing


_register("_fused_adam_", False)
_register("_fused_adamw_", True)


def _sgd(
    tr,
    params,
    grads,
    momentum_buffer_list,
    *,
    weight_decay,
    momentum,
    lr,
    dampening,
    nesterov,
    maximize,
    is_first_step,
    grad_scale=None,
    found_inf=None,
):
    """SGD's step: decay added to the gradient, then momentum (the first step's buffer is the gradient itself),
    Nesterov or not; ``momentum``'s being zero (keyed by value, like every 0) decides whether there are buffers."""
    if not params:
        return ()
    f32 = torch.float32
    fn = params[0].fn
    lr_v, scale, skip = _step_inputs(tr, fn, lr, grad_scale, found_inf)
    wd_v = tr.scalar(weight_decay, f32) if plain(weight_decay) != 0 else None
    mom_v = tr.scalar(momentum, f32) if plain(momentum) != 0 else None
    damp_keep = E.sub(E.const(fn, 1.0, f32), tr.scalar(dampening, f32)) if mom_v is not None else None
    new_params = []
    for i, p in enumerate(params):
        acc, S = _acc(p)
        pv, g = E.convert(p, acc), E.convert(grads[i], acc)
        outs = []
        if scale is not None:
            g = E.div(g, S(scale))
            outs.append((grads[i], g))
        if maximize:
            g = E.unary("negate", g)
        if wd_v is not None:
            g = E.add(g, E.mul(pv, S(wd_v)))
        if mom_v is not None:
            if is_first_step:
                buf = g
            else:
                buf = E.add(E.mul(E.convert(momentum_buffer_list[i], acc), S(mom_v)), E.mul(g, S(damp_keep)))
            outs.append((momentum_buffer_list[i], buf))
            g = E.add(g, E.mul(buf, S(mom_v))) if nesterov else buf
        pv = E.sub(pv, E.mul(g, S(lr_v)))
        new_params.append(_written(tr, [(p, pv)] + outs, skip))
    return tuple(new_params)


inplace_lowering("_fused_sgd_", "_fused_sgd_.tensor_lr")(_sgd)
for _name in ("_fused_sgd_", "_fused_sgd_.tensor_lr"):
    META[_name] = lambda *args, **kwargs: None  # no meta kernel in PyTorch; it returns nothing
