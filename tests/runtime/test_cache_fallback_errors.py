import os
import subprocess
import sys

import pytest
import torch

import torchtpu
from torchtpu import fallback


# -- cache -------------------------------------------------------------------------------------
def test_second_identical_call_compiles_nothing():
    x = torch.randn(7, 3, device="tpu")
    for _ in range(2):  # (fused mode: the first chunk also holds randn)
        y = (x * 3.25).sum(0)
        torchtpu.sync()  # fused mode launches at a sync
    before = torchtpu.metrics.counters()
    y = (x * 3.25).sum(0)  # noqa: F841  (a live result: fused mode computes only what is still needed)
    torchtpu.sync()
    after = torchtpu.metrics.counters()
    assert after.get("compiles", 0) == before.get("compiles", 0)
    assert after["cache_hits.memory"] > before.get("cache_hits.memory", 0)


def test_changed_scalar_compiles_nothing():
    x = torch.randn(7, 3, device="tpu")
    y = torch.randn(7, 3, device="tpu")
    for _ in range(2):  # (fused mode: the first chunk also holds the two randn)
        x.mul_(0.1)
        x.add_(y, alpha=0.5)
        torchtpu.sync()
    c0 = torchtpu.metrics.counters().get("compiles", 0)
    for lr in (0.2, 0.3, 1e-4, 0.123):  # every value is new: a runtime parameter, not a constant
        x.mul_(lr)
        x.add_(y, alpha=-lr)
        torchtpu.sync()
    assert torchtpu.metrics.counters().get("compiles", 0) == c0


# -- fallback ---------------------------------------------------------------------------------
def test_fallback_is_counted_and_correct(monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())  # warned once per process: an earlier test may have used it
    x = torch.tensor([3.0, -1.0, 2.0, 7.0, 0.5])
    with pytest.warns(UserWarning, match="special_airy_ai"):
        y = torch.special.airy_ai(x.to("tpu"))  # airy_ai has neither a rule nor a decomposition yet
    assert y.device.type == "tpu"
    assert torch.equal(y.cpu(), torch.special.airy_ai(x))
    c = torchtpu.metrics.counters()
    assert c["fallback.special_airy_ai.out"] == 1
    assert "CPU fallbacks: 1" in torchtpu.metrics.report()


def test_decomposition_is_counted():
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, 3.0]])
    y = torch.count_nonzero(x.to("tpu"), dim=1)  # no rule: PyTorch decomposes it into lowered ops
    assert torch.equal(y.cpu(), torch.count_nonzero(x, dim=1))
    c = torchtpu.metrics.counters()
    assert c["decomposed.count_nonzero.dim_IntList"] == 1
    assert not any(k.startswith("fallback.") for k in c)


def test_fallback_error_policy():
    code = "import torch, torchtpu\ntorch.special.airy_ai(torch.ones(3, device='tpu'))\n"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TORCHTPU_FALLBACK="error"),
    )
    assert out.returncode != 0 and "airy_ai" in out.stderr and "TORCHTPU_FALLBACK=error" in out.stderr


def test_fallback_out_writes_back():
    x = torch.tensor([0.5, -1.0, 2.0])
    t = torch.zeros(3, device="tpu")
    torch.special.airy_ai(x.to("tpu"), out=t)  # no rule: the CPU fallback fills `out`, which must land on tpu
    assert t.device.type == "tpu" and torch.equal(t.cpu(), torch.special.airy_ai(x))
    assert torchtpu.metrics.counters()["fallback.special_airy_ai.out"] == 1


# -- bad input -----------------------------------------------------------------------------------
def test_shape_mismatch_names_op_and_shapes():
    with pytest.raises(RuntimeError) as e:
        torch.randn(3, 4, device="tpu") @ torch.randn(5, 2, device="tpu")
    assert "mm" in str(e.value) and "float32[3, 4]" in str(e.value) and "float32[5, 2]" in str(e.value)


def test_dtype_mismatch_is_an_error():
    with pytest.raises(RuntimeError) as e:
        torch.mm(torch.randn(2, 2, device="tpu"), torch.ones(2, 2, device="tpu", dtype=torch.float64))
    assert "mm" in str(e.value) and "float64" in str(e.value)
    with pytest.raises(RuntimeError, match="can't be cast|result type|not possible"):
        torch.ones(2, device="tpu", dtype=torch.int64).add_(torch.ones(2, device="tpu") * 0.5)


def test_two_devices_is_an_error():
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device="tpu") + torch.ones(3)


def test_out_of_range_index_is_an_error_not_a_crash():
    with pytest.raises((RuntimeError, IndexError)):
        torch.ones(3, device="tpu")[5]


def test_float_arguments_that_shape_outputs_are_not_confused_by_the_metadata_cache():
    import torch.nn.functional as F

    x = torch.randn(1, 2, 4, 4)
    for sf in (2.0, 3.0, 1.5):
        assert F.interpolate(x.to("tpu"), scale_factor=sf).shape == F.interpolate(x, scale_factor=sf).shape
    assert torch.arange(0, 2.5, 0.5, device="tpu").shape == (5,)
    assert torch.arange(0, 1.5, 0.5, device="tpu").shape == (3,)


def test_memory_cache_is_bounded_lru(monkeypatch):
    from torchtpu import cache

    monkeypatch.setattr(cache, "MAX_ENTRIES", 2)
    torchtpu.metrics.reset()
    for n in (3, 4, 5, 3):  # the fourth call recompiles the evicted first program
        x = torch.arange(float(n), device="tpu")
        assert torch.equal((x * 2 + 1).cpu(), torch.arange(float(n)) * 2 + 1)
    assert cache.size() <= 2
    assert torchtpu.metrics.counters().get("cache_evictions", 0) >= 2
