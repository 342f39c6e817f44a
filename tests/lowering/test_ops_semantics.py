"""Behaviour the OpInfo sweep does not pin down: LAPACK-style errors, host-sync counts of data-dependent ops,
where tpu follows cuda rather than a CPU bug, and no fallback on the paths models use."""

import pytest
import torch
import torch.nn.functional as F

import torchtpu


def _no_fallback():
    return not any(k.startswith("fallback.") for k in torchtpu.metrics.counters())


def test_cholesky_of_non_positive_definite_names_the_minor():
    a = torch.tensor([[4.0, 2.0, 0.0], [2.0, 5.0, 0.0], [0.0, 0.0, -1.0]])  # third leading minor fails
    _, info = torch.linalg.cholesky_ex(a.to("tpu"))
    assert info.item() == torch.linalg.cholesky_ex(a)[1].item() == 3
    with pytest.raises(RuntimeError, match="order 3 is not positive-definite"):
        torch.linalg.cholesky(a.to("tpu"))
    assert _no_fallback()


def test_singular_solve_and_inverse_raise_like_cpu():
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    assert torch.linalg.inv_ex(a.to("tpu"))[1].item() == torch.linalg.inv_ex(a)[1].item() == 2
    with pytest.raises(RuntimeError, match="singular"):
        torch.linalg.solve(a.to("tpu"), torch.ones(2, device="tpu"))


def test_solve_gradient_matches_cpu():
    a = torch.randn(4, 4) + 4 * torch.eye(4)
    b = torch.randn(4, 2)
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    torch.linalg.solve(ac, bc).square().sum().backward()
    at, bt = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    torch.linalg.solve(at, bt).square().sum().backward()
    torch.testing.assert_close(at.grad.cpu(), ac.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(bt.grad.cpu(), bc.grad, rtol=1e-4, atol=1e-4)
    assert _no_fallback()


def test_embedding_bag_scale_grad_by_freq_divides_by_each_index_count():
    # CPU's dense backward divides by the wrong count here (pytorch/pytorch#190063, fixed after 2.13);
    # tpu follows the documented definition, as cuda does.
    w = torch.ones(4, 3, device="tpu", requires_grad=True)
    out = F.embedding_bag(
        torch.tensor([1, 1, 3], device="tpu"), w, torch.tensor([0], device="tpu"), mode="sum", scale_grad_by_freq=True
    )
    out.sum().backward()
    assert w.grad[:, 0].cpu().tolist() == [0.0, 1.0, 0.0, 1.0]


def test_unique_dim_and_consecutive_sync_once_each():
    x = torch.tensor([[1, 2], [0, 5], [1, 2], [0, 5], [3, 3]])
    torchtpu.metrics.reset()
    v, inv, cnt = torch.unique(x.to("tpu"), dim=0, return_inverse=True, return_counts=True)
    ev, einv, ecnt = torch.unique(x, dim=0, return_inverse=True, return_counts=True)
    assert torch.equal(v.cpu(), ev) and torch.equal(inv.cpu(), einv) and torch.equal(cnt.cpu(), ecnt)
    assert torchtpu.metrics.counters()["host_sync.unique"] == 1
    y = torch.tensor([1, 1, 2, 2, 2, 1, 3])
    v, cnt = torch.unique_consecutive(y.to("tpu"), return_counts=True)
    assert torch.equal(v.cpu(), torch.tensor([1, 2, 1, 3])) and torch.equal(cnt.cpu(), torch.tensor([2, 3, 1, 1]))
    assert _no_fallback()


def test_nonzero_static_needs_no_host_sync():
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]], device="tpu")
    torchtpu.metrics.reset()
    idx = torch.nonzero_static(x, size=3, fill_value=-1)
    assert "host_syncs" not in torchtpu.metrics.counters()
    assert idx.cpu().tolist() == [[0, 1], [1, 0], [-1, -1]]


def test_interpolate_and_grid_sample_train_without_fallback():
    x = torch.randn(2, 3, 8, 8)
    grid = torch.rand(2, 5, 5, 2) * 2 - 1
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    gc, gt = grid.clone().requires_grad_(), grid.to("tpu").requires_grad_()
    for xx, gg in ((xc, gc), (xt, gt)):
        up = F.interpolate(xx, scale_factor=2, mode="bilinear", align_corners=False)
        F.grid_sample(up, gg, mode="bicubic", padding_mode="reflection", align_corners=False).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gt.grad.cpu(), gc.grad, rtol=1e-3, atol=1e-3)
    assert _no_fallback()


def test_half_precision_arithmetic_keeps_float32_scalars_like_cpu():
    # CPU (and cuda) compute bf16/f16 add/sub/mul/div in float32 with a Python scalar kept at float32 and round
    # once; rounding 3.14 to bfloat16 first (3.140625) gives a different answer for ~1 element in 4.
    x = torch.randn(4096).to(torch.bfloat16)
    y = torch.randn(4096).to(torch.bfloat16)
    xt, yt = x.to("tpu"), y.to("tpu")
    for f in (
        lambda a, b: a * 3.14,
        lambda a, b: a / 3.3,
        lambda a, b: a.add(b, alpha=0.3),
        lambda a, b: 1.7 - a,
        lambda a, b: a * torch.tensor(0.1, dtype=torch.float32, device=a.device),
        lambda a, b: torch.addcdiv(a, a, b.abs() + 1, value=3.14),
    ):
        assert torch.equal(f(xt, yt).cpu(), f(x, y))
    # pow rounds its exponent to the tensor's dtype, as CPU does
    assert torch.equal((xt.abs() ** 0.3).cpu(), x.abs() ** 0.3)
    assert _no_fallback()


def test_integer_ops_at_the_edges():
    x = torch.tensor([5, -5, 1, -1, 7], dtype=torch.int32)
    s = torch.tensor([0, 1, 31, 32, -1], dtype=torch.int32)
    xt, st = x.to("tpu"), s.to("tpu")
    assert torch.equal((xt << st).cpu(), x << s) and torch.equal((xt >> st).cpu(), x >> s)
    assert torch.equal((xt >> 40).cpu(), x >> 40)  # sign fill, as on CPU
    a = torch.tensor([0, 12, -12, 7, 0, -(2**31), 9], dtype=torch.int32)
    b = torch.tensor([0, -18, 18, 0, -5, 0, 6], dtype=torch.int32)
    assert torch.equal(torch.gcd(a.to("tpu"), b.to("tpu")).cpu(), torch.gcd(a, b))  # gcd(INT_MIN, 0) = INT_MIN
    assert torch.equal(torch.lcm(a.to("tpu"), b.to("tpu")).cpu(), torch.lcm(a, b))
    assert _no_fallback()


def test_bincount_syncs_once_and_mode_picks_the_smallest_most_frequent():
    i = torch.tensor([0, 2, 2, 5, 2])
    w = torch.rand(5)
    torchtpu.metrics.reset()
    out = torch.bincount(i.to("tpu"), w.to("tpu"), minlength=8)
    assert out.dtype == torch.float32 and out.shape == (8,)
    torch.testing.assert_close(out.cpu(), torch.bincount(i, w, minlength=8))
    assert torchtpu.metrics.counters()["host_sync.bincount"] == 1
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(torch.tensor([-1, 2], device="tpu"))
    x = torch.tensor([[3, 1, 1, 3, 2], [2, 2, 5, 5, 0]])
    v, idx = torch.mode(x.to("tpu"), 1)
    assert v.cpu().tolist() == [1, 2] and idx.cpu().tolist() == [2, 1]  # CPU: the last index of the value
    assert _no_fallback()


def test_antialiased_resize_trains_without_fallback():
    x = torch.randn(2, 3, 17, 23)
    for mode in ("bilinear", "bicubic"):
        xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
        outs = [F.interpolate(xx, size=(5, 40), mode=mode, antialias=True) for xx in (xc, xt)]
        torch.testing.assert_close(outs[1].cpu(), outs[0], rtol=1e-5, atol=1e-5)
        for o in outs:
            (o * o).sum().backward()
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    assert _no_fallback()


def test_padded_convolutions_train_without_fallback():
    # padding_mode="reflect"/"replicate" convolutions pad explicitly: the pad's gradient must stay on tpu
    x = torch.randn(2, 3, 9, 7)
    for mode in ("reflect", "replicate"):
        torch.manual_seed(0)
        conv = torch.nn.Conv2d(3, 4, 3, padding=2, padding_mode=mode)
        conv_t = torch.nn.Conv2d(3, 4, 3, padding=2, padding_mode=mode).to("tpu")
        conv_t.load_state_dict(conv.state_dict())
        xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
        for m, xx in ((conv, xc), (conv_t, xt)):
            F.softshrink(m(xx), 0.1).square().sum().backward()
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(conv_t.weight.grad.cpu(), conv.weight.grad, rtol=1e-4, atol=1e-4)
    assert _no_fallback()


def test_repeat_interleave_with_tensor_repeats_syncs_once_unless_sized():
    r = torch.tensor([2, 0, 3, 1])
    v = torch.arange(4.0)
    torchtpu.metrics.reset()
    assert torch.equal(torch.repeat_interleave(v.to("tpu"), r.to("tpu")).cpu(), torch.repeat_interleave(v, r))
    assert torchtpu.metrics.counters()["host_sync.repeat_interleave"] == 1
    torchtpu.metrics.reset()
    out = torch.repeat_interleave(v.to("tpu"), r.to("tpu"), output_size=6)
    assert "host_sync.repeat_interleave" not in torchtpu.metrics.counters()
    assert torch.equal(out.cpu(), torch.repeat_interleave(v, r))
    assert _no_fallback()


def test_segment_reduce_initial_ties_and_zeros_as_cpu():
    d = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, float("nan")])
    lengths = torch.tensor([2, 0, 3, 1])
    for red in ("sum", "mean", "max", "min", "prod"):
        for init in (None, 10.0):
            torch.testing.assert_close(
                torch.segment_reduce(d.to("tpu"), red, lengths=lengths.to("tpu"), initial=init).cpu(),
                torch.segment_reduce(d, red, lengths=lengths, initial=init),
                equal_nan=True,
            )
    for x in (torch.tensor([3.0, 3.0, 1.0, 2.0, 2.0]), torch.tensor([0.0, 3.0, 0.0, 2.0, 0.0])):  # ties, zeros
        for red in ("max", "min", "prod", "mean"):
            a, b = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
            for xx in (a, b):
                torch.segment_reduce(xx, red, lengths=torch.tensor([2, 3], device=xx.device)).sum().backward()
            torch.testing.assert_close(b.grad.cpu(), a.grad)
    assert _no_fallback()


def test_factories_follow_a_changed_default_dtype():
    """The op table keys a call by its arguments; dtype=None follows torch.get_default_dtype(), so the key holds it
    (a signature lowered under float32 served float32 arange after set_default_dtype(float64))."""
    before = torch.get_default_dtype()
    try:
        for dtype in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(dtype)
            got = torch.arange(0, 1, 0.25, device="tpu")
            want = torch.arange(0, 1, 0.25)
            assert got.dtype == want.dtype == dtype
            assert torch.equal(got.cpu(), want)
            assert (torch.ones(3, device="tpu") * 0.5).dtype == dtype
    finally:
        torch.set_default_dtype(before)
