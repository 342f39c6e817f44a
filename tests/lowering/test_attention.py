"""F.scaled_dot_product_attention on tpu: one op forward and one backward (csrc/aten/attention.cpp,
torchtpu/lowering/attention.py) where PyTorch's math path is ~19 ops, the same values and gradients as cpu, and the
math path wherever the fused op does not apply (a mask that requires grad, 3-D inputs, sdpa_kernel, torch.func).
Dropout draws from the tpu generator inside the op (the backward draws the same mask again)."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torchtpu

FUSED, FUSED_BWD = "op.torchtpu_attn::sdpa", "op.torchtpu_attn::sdpa_backward"


def _both(q, k, v, mask=None, **kw):
    """(cpu result, cpu grads, tpu result, tpu grads, tpu op counters) for the same inputs and cotangent."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    qt, kt, vt = (x.detach().to("tpu").requires_grad_() for x in (q, k, v))
    torchtpu.metrics.reset()
    out_t = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=None if mask is None else mask.to("tpu"), **kw)
    grads_t = torch.autograd.grad(out_t, (qt, kt, vt), g.to("tpu"))
    counters = torchtpu.metrics.counters()
    return out, grads, out_t.cpu(), [x.cpu() for x in grads_t], counters


def _mask(kind, lq, lk):
    if kind == "bool":
        m = torch.rand(2, 1, lq, lk) > 0.4
        m[0, 0, 1] = False  # a query that sees no key: zeros, as torch's safe softmax gives
        return m
    if kind == "float":
        return torch.randn(lq, lk)  # broadcast over batch and heads
    return None


@pytest.mark.parametrize(
    "heads,kv_heads,lq,lk,mask,causal,dtype",
    [
        (4, 4, 8, 8, None, True, torch.float32),
        (4, 4, 5, 9, None, True, torch.float32),  # causal with fewer queries than keys: the top-left triangle
        (4, 4, 5, 9, "bool", False, torch.float32),
        (4, 4, 6, 6, "float", False, torch.float32),
        (8, 2, 8, 8, None, True, torch.float32),  # grouped query attention (enable_gqa)
        (4, 4, 8, 8, None, True, torch.bfloat16),
    ],
)
def test_attention_is_one_op_each_way_and_matches_cpu(heads, kv_heads, lq, lk, mask, causal, dtype):
    torch.manual_seed(0)
    q = torch.randn(2, heads, lq, 16, dtype=dtype)
    k, v = (torch.randn(2, kv_heads, lk, 16, dtype=dtype) for _ in range(2))
    m = _mask(mask, lq, lk)
    out, grads, out_t, grads_t, c = _both(q, k, v, m, is_causal=causal, enable_gqa=kv_heads != heads)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_t, out, **tol)
    for a, b in zip(grads_t, grads):
        torch.testing.assert_close(a, b, **tol)
    assert c.get(FUSED) == 1 and c.get(FUSED_BWD) == 1, c
    assert not any(k in c for k in ("op.bmm", "op._softmax", "op.matmul")), c  # no math path
    assert not any(k.startswith("fallback.") for k in c), c


@pytest.mark.parametrize("why", ["mask_requires_grad", "three_dims", "sdpa_kernel_math"])
def test_the_math_path_where_the_fused_op_does_not_apply(why):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    mask, ctx = None, sdpa_kernel([SDPBackend.MATH, SDPBackend.OVERRIDEABLE])
    if why == "mask_requires_grad":
        mask = torch.randn(6, 6).to("tpu").requires_grad_()
    elif why == "three_dims":
        q, k, v = q[0], k[0], v[0]
    else:
        ctx = sdpa_kernel([SDPBackend.MATH])
    qt, kt, vt = (x.to("tpu").requires_grad_() for x in (q, k, v))
    torchtpu.metrics.reset()
    with ctx:
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
    out.sum().backward()
    c = torchtpu.metrics.counters()
    assert FUSED not in c and FUSED_BWD not in c, c
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.detach().cpu())
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    if why == "mask_requires_grad":
        assert mask.grad is not None and mask.grad.shape == (6, 6)


def test_compiled_graphs_keep_the_math_decomposition_and_match():
    """torch.compile traces fake tensors: the choice there is the math path, whose ops XLA fuses in one program."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    fc = torch.compile(f, backend="tpu")
    qt, kt, vt = (x.to("tpu").requires_grad_() for x in (q, k, v))
    out = fc(qt, kt, vt)
    out.sum().backward()
    qc = q.clone().requires_grad_()
    ref = f(qc, k, v)
    ref.sum().backward()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(qt.grad.cpu(), qc.grad, rtol=1e-5, atol=1e-5)


def test_bad_shapes_raise_as_on_cpu():
    q = torch.randn(2, 3, 4, 8, device="tpu")  # 3 query heads over 2 key heads: no grouping fits
    k = torch.randn(2, 2, 4, 8, device="tpu")
    with pytest.raises(RuntimeError, match="Number of heads in key and value must divide"):
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    q, k = torch.randn(2, 4, 4, 8, device="tpu"), torch.randn(2, 4, 4, 7, device="tpu")  # head dims differ
    with pytest.raises(RuntimeError, match=r"bmm\(float32\[8, 4, 8\] on tpu:0, float32\[8, 7, 4\]"):
        F.scaled_dot_product_attention(q, k, k)


def test_torch_func_transforms_take_the_math_path_and_match():
    """vmap has no batching rule for PyTorch's overrideable attention op: under torch.func the math path runs."""
    torch.manual_seed(0)
    qs, k, v = torch.randn(3, 2, 4, 8, 16), torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16)

    def f(q):
        return F.scaled_dot_product_attention(q, k.to(q.device), v.to(q.device), is_causal=True)

    torch.testing.assert_close(torch.vmap(f)(qs.to("tpu")).cpu(), torch.vmap(f)(qs), rtol=1e-5, atol=1e-5)
    grad = torch.func.grad(lambda q: f(q).sum())
    torch.testing.assert_close(grad(qs[0].to("tpu")).cpu(), grad(qs[0]), rtol=1e-5, atol=1e-5)


def test_the_backend_choice_asked_as_an_op_is_tpus():
    q = torch.randn(1, 2, 4, 8, device="tpu")
    torchtpu.metrics.reset()
    assert torch._fused_sdp_choice(q, q, q) == SDPBackend.OVERRIDEABLE.value
    assert torch._fused_sdp_choice(q, q, q, dropout_p=0.5) == SDPBackend.OVERRIDEABLE.value
    assert torch._fused_sdp_choice(q[0], q[0], q[0]) == SDPBackend.MATH.value  # 3-D
    assert not any(k.startswith("fallback.") for k in torchtpu.metrics.counters())


def test_dropout_drops_a_fraction_p_reproducibly_and_its_gradient_is_the_forwards():
    """Uniform attention over one-hot values shows the dropped probabilities; the gradient (the backward draws the
    forward's mask again from the Philox state in philox_seed) matches finite differences of the same draw."""
    s, p = 16, 0.25
    q = torch.zeros(2, 4, s, s, device="tpu")
    v = torch.eye(s).expand(2, 4, s, s).contiguous().to("tpu")
    torch.tpu.manual_seed(0)
    torchtpu.metrics.reset()
    out = F.scaled_dot_product_attention(q, q, v, dropout_p=p).cpu()
    assert torchtpu.metrics.counters().get(FUSED) == 1
    dropped = (out == 0).float().mean().item()
    assert abs(dropped - p) < 0.05, dropped  # 2048 draws: 5 standard deviations is 0.048
    assert torch.allclose(out[out != 0], torch.tensor(1 / s / (1 - p)))
    torch.tpu.manual_seed(0)
    assert torch.equal(F.scaled_dot_product_attention(q, q, v, dropout_p=p).cpu(), out)
    assert not torch.equal(F.scaled_dot_product_attention(q, q, v, dropout_p=p).cpu(), out)

    torch.manual_seed(1)
    args = [torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(3)]

    def f(*xs):
        torch.tpu.manual_seed(3)
        return F.scaled_dot_product_attention(*xs, dropout_p=0.4, is_causal=True)

    leaves = [x.to("tpu").requires_grad_() for x in args]
    out = f(*leaves)
    g = torch.randn(out.shape, dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves, g.to("tpu"))
    eps = 1e-6
    for i, grad in enumerate(grads):
        d = torch.randn_like(args[i])
        plus = [x.to("tpu") + (eps * d.to("tpu") if j == i else 0) for j, x in enumerate(args)]
        minus = [x.to("tpu") - (eps * d.to("tpu") if j == i else 0) for j, x in enumerate(args)]
        numeric = ((f(*plus) - f(*minus)).cpu() * g).sum() / (2 * eps)
        torch.testing.assert_close((grad.cpu() * d).sum(), numeric, rtol=1e-6, atol=1e-8)
