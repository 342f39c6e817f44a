"""torchtpu.jax_op: JAX functions and Pallas kernels as torch ops on tpu, in a model that trains."""

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu
from torchtpu.jax_ops import JaxOpError


@torchtpu.jax_op
def jax_rms_norm(x, w):
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w


@torchtpu.jax_op
def jax_swiglu(x, w_gate, w_up):
    return jax.nn.silu(x @ w_gate.T) * (x @ w_up.T)


def _softmax_kernel(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - x.max(axis=-1, keepdims=True))
    o_ref[...] = e / e.sum(axis=-1, keepdims=True)


def _pallas_softmax(x):
    from jax.experimental import pallas as pl

    rows = 8
    spec = pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(
        _softmax_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // rows,),
        in_specs=[spec],
        out_specs=spec,
        interpret=True,
    )(x)


def _softmax_backward(x, g):
    y = jax.nn.softmax(x, axis=-1)
    return y * (g - (g * y).sum(-1, keepdims=True))


pallas_softmax = torchtpu.jax_op(_pallas_softmax, name="pallas_softmax", backward=_softmax_backward)


class Block(nn.Module):
    """RMSNorm -> SwiGLU -> softmax over features: in JAX (use_jax) or in PyTorch."""

    def __init__(self, d=16, h=32, use_jax=True):
        super().__init__()
        self.use_jax = use_jax
        self.norm = nn.Parameter(torch.rand(d) + 0.5)
        self.gate, self.up = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False)
        self.down = nn.Linear(h, 4)

    def forward(self, x):
        if self.use_jax and x.device.type == "tpu":
            h = jax_swiglu(jax_rms_norm(x, self.norm), self.gate.weight, self.up.weight)
            return pallas_softmax(self.down(h))
        h = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * self.norm
        h = F.silu(self.gate(h)) * self.up(h)
        return self.down(h).softmax(-1)


def _train(device, mode=None, compiled=False, steps=4):
    torch.manual_seed(0)
    model = Block(use_jax=device == "tpu").to(device)
    fwd = torch.compile(model, backend="tpu") if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 16, generator=g), torch.randint(0, 4, (16,), generator=g)
    losses = []
    with torchtpu.mode(mode) if mode else torchtpu.mode(torchtpu.get_mode()):
        for _ in range(steps):
            out = fwd(x.to(device))
            loss = F.nll_loss(out.log(), y.to(device))
            opt.zero_grad()
            loss.backward()
            grads = [p.grad.detach().cpu().clone() for p in model.parameters()]
            opt.step()
            losses.append(loss.item())
    return losses, grads


@pytest.mark.parametrize(
    "mode,compiled", [("strict", False), ("fused", False), ("debug", False), ("fused", True), ("strict", True)]
)
def test_jax_and_pallas_ops_train_like_the_pytorch_model_on_cpu(mode, compiled):
    torch._dynamo.reset()
    cpu_losses, cpu_grads = _train("cpu")
    tpu_losses, tpu_grads = _train("tpu", mode, compiled)
    assert max(abs(a - b) / abs(a) for a, b in zip(cpu_losses, tpu_losses)) < 1e-5, (cpu_losses, tpu_losses)
    for a, b in zip(cpu_grads, tpu_grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    c = torchtpu.metrics.counters()
    assert c.get("op.torchtpu_jax::pallas_softmax", 0) + c.get("compile.program_runs", 0) > 0
    assert not any(k.startswith("fallback.") for k in c), c
    if compiled:
        assert c.get("compile.captures", 0) >= 2 and not c.get("compile.eager_graphs"), c


def test_a_jax_op_reads_device_buffers_without_copies_and_runs_once_lowered():
    x, w = torch.randn(8, 16, device="tpu"), torch.randn(16, device="tpu")
    jax_rms_norm(x, w)
    torchtpu.metrics.reset()
    for _ in range(3):
        y = jax_rms_norm(x, w)
    torchtpu.sync()
    c = torchtpu.metrics.counters()
    assert c.get("transfers.d2h", 0) == 0 and c.get("transfers.h2d", 0) == 0 and c.get("lowerings", 0) == 0, c
    ref = x.cpu() * torch.rsqrt((x.cpu() ** 2).mean(-1, keepdim=True) + 1e-6) * w.cpu()
    assert torch.allclose(y.cpu(), ref, atol=1e-5)


def test_on_cpu_tensors_it_runs_through_jax_on_the_host():
    x, w = torch.randn(4, 16), torch.randn(16)
    ref = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(jax_rms_norm(x, w), ref, atol=1e-5)


def test_errors_name_the_jax_function_and_shapes():
    with pytest.raises(RuntimeError) as e:
        jax_swiglu(
            torch.randn(4, 16, device="tpu"), torch.randn(32, 8, device="tpu"), torch.randn(32, 16, device="tpu")
        )
    assert "jax_op jax_swiglu(float32[4, 16], float32[32, 8], float32[32, 16])" in str(e.value)
    assert "dot_general" in str(e.value) and "test_jax_op.py" in str(e.value)  # JAX's reason, the user's line
    with pytest.raises(JaxOpError, match=r"jax_op jax_swiglu\(float32\[4, 16\], float32\[32, 8\]"):
        jax_swiglu(torch.randn(4, 16), torch.randn(32, 8), torch.randn(32, 16))  # on cpu
    with pytest.raises(TypeError, match="jax_rms_norm: argument 1 is a float"):
        jax_rms_norm(torch.randn(4, 16, device="tpu"), 1.0)
    with pytest.raises(ValueError, match="exists already"):
        torchtpu.jax_op(lambda x: x, name="jax_rms_norm")
