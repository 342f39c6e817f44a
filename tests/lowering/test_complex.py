"""Complex numbers on tpu: storage and transfers, printing, arithmetic, views that reinterpret the storage
(view_as_real / view_as_complex, the conjugate bit), polar/abs/angle, matmul, FFTs and their gradients, and
rotary embeddings as Meta's Llama writes them. The OpInfo sweep checks every op in complex64 besides."""

import math
import re

import pytest
import torch
from conftest import assert_same

T = "tpu"


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_transfers_printing_and_arithmetic(dtype):
    x = torch.tensor([1 + 2j, 3 - 1j, -0.5 + 0.25j, 0j], dtype=dtype)
    t = x.to(T)
    assert t.dtype == dtype and torch.equal(t.cpu(), x)
    assert " ".join(re.sub(r",\s*device='tpu:0'", "", repr(t)).split()) == " ".join(repr(x).split())
    for f in (
        lambda a: a * 2,
        lambda a: a + a,
        lambda a: a * a,
        lambda a: a / (1 + 1j),
        lambda a: a - 3j,
        lambda a: a.exp(),
        lambda a: (a + 1).log(),
        lambda a: a.sqrt(),
        lambda a: a.tanh(),
        lambda a: a.sum(),
        lambda a: a.mean(),
        lambda a: a.abs(),
        lambda a: a.angle(),
        lambda a: a.sgn(),
        lambda a: a.conj() * 1,
        lambda a: a.real * 2,
        lambda a: a.imag + 1,
        lambda a: a == a.conj(),
        lambda a: torch.isfinite(a),
        lambda a: a.pow(2),
        lambda a: a.reciprocal(),
    ):
        assert_same(f(x), f(t), rtol=1e-5, atol=1e-6)


def test_views_reinterpret_the_storage():
    x = torch.randn(4, 6)
    t = x.to(T)
    c = torch.view_as_complex(t.view(4, 3, 2))  # shares the float storage
    assert_same(torch.view_as_complex(x.view(4, 3, 2)), c)
    c.mul_(1j)  # writes through to the float tensor
    ref = x.clone()
    torch.view_as_complex(ref.view(4, 3, 2)).mul_(1j)
    assert_same(ref, t)
    r = torch.view_as_real(c)
    r[..., 1] = 0  # zero every imaginary part of c through its real view
    assert torch.equal(c.imag.cpu(), torch.zeros(4, 3))
    z = torch.zeros(3, dtype=torch.complex64, device=T)
    z.conj().copy_(torch.tensor([1j, 2j, 3j]))  # a write through the conjugate bit
    assert torch.equal(z.cpu(), torch.tensor([-1j, -2j, -3j]))
    assert_same(
        torch.view_as_real(torch.tensor([1 + 2j]).conj().resolve_conj()),
        torch.view_as_real(torch.tensor([1 + 2j], device=T).conj().resolve_conj()),
    )


def test_construction_and_matmul():
    a, b = torch.randn(5, 3), torch.randn(5, 3)
    assert_same(torch.complex(a, b), torch.complex(a.to(T), b.to(T)))
    assert_same(torch.polar(a.abs(), b), torch.polar(a.abs().to(T), b.to(T)), rtol=1e-5, atol=1e-6)
    m = torch.randn(4, 5, dtype=torch.complex64)
    n = torch.randn(5, 3, dtype=torch.complex64)
    assert_same(m @ n, m.to(T) @ n.to(T), rtol=1e-5, atol=1e-5)
    assert_same(m.mH @ m, m.to(T).mH @ m.to(T), rtol=1e-5, atol=1e-5)  # the conjugate bit reaches the matmul
    assert_same(
        torch.linalg.solve(m @ m.mH, n[:4]), torch.linalg.solve((m @ m.mH).to(T), n[:4].to(T)), rtol=1e-3, atol=1e-4
    )


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.fft.fft(x),
        lambda x: torch.fft.ifft(x, norm="ortho"),
        lambda x: torch.fft.fft2(x),
        lambda x: torch.fft.fftn(x, dim=(0, 1), norm="forward"),
        lambda x: torch.fft.rfft(x.real),
        lambda x: torch.fft.irfft(x, n=10),
        lambda x: torch.fft.hfft(x),
        lambda x: torch.fft.ihfft(x.real),
        lambda x: torch.fft.rfftn(x.real),
        lambda x: torch.fft.irfft2(x),
        lambda x: torch.stft(x.real.reshape(-1), 8, window=torch.hann_window(8, device=x.device), return_complex=True),
    ],
)
def test_fft_family_forward_and_gradient(fn):
    x = torch.randn(6, 8, dtype=torch.complex64, requires_grad=True)
    t = x.detach().to(T).requires_grad_()
    out, tout = fn(x), fn(t)
    assert_same(out.detach(), tout.detach(), rtol=1e-4, atol=1e-5)
    g = torch.randn(out.shape, dtype=out.dtype)
    (gx,) = torch.autograd.grad(out, x, g)
    (gt,) = torch.autograd.grad(tout, t, g.to(T))
    assert_same(gx, gt, rtol=1e-4, atol=1e-4)


def test_rotary_embeddings_with_complex_numbers_train():
    import zoo

    r = zoo.side_by_side("meta_llama", steps=3)
    assert not r["fallbacks"] and r["max_rel_diff"] < 1e-4, r["max_rel_diff"]
    assert "op.view_as_complex" not in r["counters"]  # a metadata view, not a kernel
    assert any(k.startswith("op.polar") or k.startswith("op.mul") for k in r["counters"])


def test_complex_dtype_errors_are_clear():
    with pytest.raises(RuntimeError, match="ComplexHalf is not supported on tpu"):
        torch.zeros(2, dtype=torch.chalf, device=T)
    x = torch.ones(2, dtype=torch.complex64, device=T)
    with pytest.raises(RuntimeError):
        torch.complex(torch.ones(2, device=T), torch.ones(2, dtype=torch.float64, device=T))
    assert math.isclose(x.abs().sum().item(), 2.0)
