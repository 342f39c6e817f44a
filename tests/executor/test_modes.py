import os
import subprocess
import sys

import pytest
import torch

import torchtpu


def test_mode_api():
    default = torchtpu.get_mode()  # strict, or what TORCHTPU_MODE says (CI runs the suite in fused mode too)
    assert default == os.environ.get("TORCHTPU_MODE", "strict")
    for m in ("debug", "fused", "strict"):
        with torchtpu.mode(m):
            assert torchtpu.get_mode() == m
        assert torchtpu.get_mode() == default
    torchtpu.set_mode("debug")
    torchtpu.set_mode(default)
    with pytest.raises(ValueError, match="expected one of"):
        torchtpu.set_mode("turbo")


def test_debug_errors_name_op_shapes_and_line():
    a, b = torch.randn(3, 4, device="tpu"), torch.randn(5, 4, device="tpu")
    with torchtpu.mode("debug"), pytest.raises(RuntimeError) as e:
        a + b
    msg = str(e.value)
    assert "add.Tensor" in msg and "float32[3, 4] on tpu:0" in msg and "test_modes.py" in msg


def test_check_nans_reports_first_op():
    code = (
        "import torch, torchtpu\nx = torch.tensor([1.0, -1.0], device='tpu')\ny = x * 2\n"
        "with torchtpu.mode('debug'):\n    z = torch.log(y)\n"
    )
    env = dict(os.environ, TORCHTPU_CHECK_NANS="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0
    assert "log" in out.stderr and "NaN" in out.stderr


def test_env_selects_mode():
    code = "import torchtpu; print(torchtpu.get_mode())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TORCHTPU_MODE="debug"),
    )
    assert out.stdout.strip() == "debug", out.stderr


def test_strict_is_asynchronous_until_read():
    x = torch.randn(256, 256, device="tpu")
    torchtpu.metrics.reset()
    y = (x @ x).relu().sum()
    assert torchtpu.metrics.counters().get("host_syncs", 0) == 0  # nothing waited yet
    y.item()
    assert torchtpu.metrics.counters()["host_sync.item"] == 1


def test_modes_give_same_results():
    x = torch.randn(8, 8)
    outs = []
    for m in ("strict", "debug", "fused"):
        with torchtpu.mode(m):
            t = x.to("tpu")
            outs.append((t @ t).softmax(-1).cpu())
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.testing.assert_close(outs[0], outs[2], rtol=1e-6, atol=1e-7)  # fused: XLA may reassociate
