"""PyTorch's own OpInfo `error_inputs`, the external judge of bad-input handling: every case that raises on cpu
must raise on tpu too, in strict, fused and debug mode (at the latest at the next synchronization, as cuda's
device-side asserts do), for the function, in-place and out= variants, in every dtype the OpInfo lists, with the
case moved from cpu (keeping its aliasing) and built on tpu by the OpInfo itself (tests/tools/error_sweep.py).

The suite's two passes (scripts/test.sh) share the ops: the strict pass takes every other op of op_db, the fused pass
the rest (the CI budget); TORCHTPU_SWEEP=full takes every op in either pass."""

import os
import time

import error_sweep
import pytest
import torch

import torchtpu


@pytest.fixture(scope="module")
def error_sweep_result():
    t0 = time.time()
    ops = error_sweep.error_ops()
    if os.environ.get("TORCHTPU_SWEEP") != "full":
        ops = ops[(torchtpu.get_mode() == "fused") :: 2]
    stats, silent, unmovable = error_sweep.sweep(ops)
    print(f"\nerror_inputs: {dict(stats)}, unmovable {len(unmovable)}, silent {len(silent)} ({time.time() - t0:.0f} s)")
    return stats, silent, unmovable


def test_every_cpu_error_raises_on_tpu(error_sweep_result):
    stats, silent, unmovable = error_sweep_result
    full = os.environ.get("TORCHTPU_SWEEP") == "full"
    # torch 2.13 op_db: 6,559 (op, case, variant, dtype) cases raise on cpu as their OpInfo means, ~3,300 a pass
    assert stats["raise_on_cpu"] >= (6500 if full else 3000)
    assert stats["runs"] == 6 * stats["raise_on_cpu"]  # 3 modes, moved and built
    assert not silent, silent
    assert not unmovable, unmovable


def test_an_out_resized_into_an_input_raises_as_on_cpu():
    # the case an OpInfo builds on the device: out= a 1-element view that gather must resize to 2 elements, in
    # place in its storage, where it comes to overlap the index (cpu checks after resizing; so must tpu)
    for dev in ("cpu", "tpu"):
        ind = torch.tensor([2, 1, 0], device=dev)
        with pytest.raises(RuntimeError, match="written-to tensor refer to a single memory location"):
            torch.gather(ind.clone(), 0, ind[1:], out=ind[:1])
            torch.tpu.synchronize()
