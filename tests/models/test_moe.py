"""Mixture-of-experts layers on tpu: torch._grouped_mm (transformers' "grouped_mm" experts, the default of its MoE
models) is one program per shape whatever the routing: the group sizes stay on the device, so a new routing reads
nothing on the host and compiles nothing."""

import itertools

import pytest
import torch
import zoo

import torchtpu


def _offs(sizes):
    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32)


def _cases(dtype):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    sizes = [3, 0, 9, 2]  # an empty group; 2 rows (columns) after the last offset
    m = sum(sizes) + 2
    return {
        "2d3d": (r(m, 16), r(4, 16, 8), _offs(sizes), (slice(0, m - 2),)),
        "3d2d": (r(4, 8, 16), r(16, m), _offs(sizes), (slice(None), slice(0, m - 2))),
        "2d2d": (r(8, m), r(m, 16), _offs(sizes), ()),
        "3d3d": (r(4, 8, 16), r(4, 16, 8), None, ()),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["2d3d", "3d2d", "2d2d", "3d3d"])
def test_grouped_mm_matches_cpu_with_gradients(mode, dtype):
    a, b, offs, covered = _cases(dtype)[mode]
    outs, grads = [], []
    for dev in ("cpu", "tpu"):
        x = a.detach().to(dev).requires_grad_()
        w = b.detach().to(dev).requires_grad_()
        out = torch._grouped_mm(x, w, None if offs is None else offs.to(dev))
        cot = torch.ones_like(out)
        if covered:  # CPU leaves the rows (columns) after the last offset unset: only the groups are compared
            cot = torch.zeros_like(out)
            cot[covered] = 1
        (out.float() * cot.float()).sum().backward()
        outs.append(out[covered].cpu() if covered else out.cpu())
        grads.append((x.grad.cpu(), w.grad.cpu()))
    tol = dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    assert outs[1].dtype == outs[0].dtype == dtype
    torch.testing.assert_close(outs[1], outs[0], **tol)
    if mode == "2d3d":  # the uncovered rows' gradient is CPU's unset values too
        grads = [(gx[covered], gw) for gx, gw in grads]
    if mode == "3d2d":
        grads = [(gx, gw[covered]) for gx, gw in grads]
    if mode == "2d2d":  # the output does not depend on the contraction after the last offset: its true gradient is 0
        k = int(offs[-1])
        assert torch.count_nonzero(grads[1][0][:, k:]) == 0 and torch.count_nonzero(grads[1][1][k:]) == 0
        grads = [(gx[:, :k], gw[:k]) for gx, gw in grads]
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, **tol)
    if covered:
        full = torch._grouped_mm(a.to("tpu"), b.to("tpu"), offs.to("tpu")).cpu()
        rest = full[covered[0].stop :] if mode == "2d3d" else full[:, covered[1].stop :]
        assert torch.count_nonzero(rest) == 0  # zeros, not garbage


def test_a_new_routing_reads_nothing_on_the_host_and_compiles_nothing():
    ha, hb = torch.randn(32, 16), torch.randn(4, 16, 8)
    a, b = ha.to("tpu"), hb.to("tpu")
    torch._grouped_mm(a, b, _offs([8, 8, 8, 8]).to("tpu")).cpu()  # the loop's program (fused: the same chunk)
    c0 = torchtpu.metrics.counters()
    for sizes in ([1, 2, 3, 26], [0, 0, 32, 0], [10, 10, 6, 6]):
        offs = _offs(sizes)
        got = torch._grouped_mm(a, b, offs.to("tpu"))
        torch.testing.assert_close(got.cpu(), torch._grouped_mm(ha, hb, offs), rtol=1e-5, atol=1e-5)
    c1 = torchtpu.metrics.counters()
    assert c1.get("compiles", 0) == c0.get("compiles", 0)
    assert c1.get("host_syncs", 0) - c0.get("host_syncs", 0) == 3  # the three .cpu() reads of the results


@pytest.mark.parametrize("offs", [[5, 3, 8, 8], [2, 4, 6, 40], [-1, 4, 6, 8]])
def test_bad_offsets_raise_instead_of_reading_out_of_bounds(offs):
    a, b = torch.randn(8, 16, device="tpu"), torch.randn(4, 16, 8, device="tpu")
    with pytest.raises(RuntimeError, match="offsets must be nondecreasing"):
        torch._grouped_mm(a, b, torch.tensor(offs, dtype=torch.int32, device="tpu")).cpu()


def test_grouped_mm_refuses_what_cpu_refuses():
    a, b = torch.randn(8, 16, device="tpu"), torch.randn(4, 16, 8, device="tpu")
    with pytest.raises(RuntimeError, match="Offsets have to be int32"):
        torch._grouped_mm(a, b, torch.tensor([2, 4, 6, 8], device="tpu"))
    with pytest.raises(RuntimeError, match="Have to provide offsets"):
        torch._grouped_mm(a, b)


def test_hugging_face_mixtral_trains_with_one_host_read_per_step_and_no_recompiles():
    r = zoo.side_by_side("mixtral", steps=6)
    assert r["max_rel_diff"] < 1e-5, (r["cpu"]["losses"], r["tpu"]["losses"])
    assert not r["fallbacks"], r["fallbacks"]
    assert r["compiles_after_step2"] == 0
    assert r["counters"].get("host_syncs", 0) == 6, {k: v for k, v in r["counters"].items() if "sync" in k}
