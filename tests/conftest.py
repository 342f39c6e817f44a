import os

# Two XLA:CPU devices, so tpu:1 is tested as tpu:0 is (must be set before torch autoloads torchtpu).
os.environ.setdefault("TORCHTPU_NUM_CPU_DEVICES", "2")
# The suite compiles thousands of one-op programs: keep them out of the user's disk cache
# (tests/runtime/test_cache_disk.py turns the disk tier on where it is tested).
os.environ.setdefault("TORCHTPU_CACHE_DIR", "")
# XLA:CPU compiles are most of the suite's time (thousands of one-op programs, ~100 ms each here), so the suite
# compiles for speed of compiling: XLA's backend (LLVM) at optimization level 0 (~20% off each compile; the OpInfo
# sweep's float32 samples of 160 ops, 29.0 -> 22.9 s) and fusions emitted by XLA:CPU's elemental emitter rather than
# its MLIR fusion emitters (~35% off each: a one-op program 96 -> 62 ms, a slice of the error sweep 27.9 -> 20.3 s,
# 2026-12-07). The HLO passes and the numerics (no fast math either way) stay those users get; bench/ and the
# README's main job run at XLA's defaults; processes the tests start inherit these.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false")

import sys

# tests import the helpers in tests/tools (zoo, sweeps) and the models in examples/ by their module names
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, "tools"), os.path.join(os.path.dirname(_HERE), "examples")]

import pytest  # noqa: E402
import torch  # noqa: E402
import watchdog  # noqa: E402

import torchtpu  # noqa: E402,F401  (registers the "tpu" device)

_HANG_S = float(os.environ.get("TORCHTPU_TEST_HANG_S", "600"))
_WATCH = None


def pytest_configure(config):
    global _WATCH
    capman = config.pluginmanager.getplugin("capturemanager")
    if _HANG_S > 0:
        _WATCH = watchdog.Watchdog(_HANG_S, capman.suspend_global_capture if capman else None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test whose body runs past TORCHTPU_TEST_HANG_S gets its native and Python stacks logged and ends the pass
    (watchdog.py). Setups are not watched: the sweeps' cold setups take up to ~14 min in a loaded fresh clone."""
    if _WATCH is not None:
        _WATCH.start(item.nodeid)
    yield
    if _WATCH is not None:
        _WATCH.stop()


def pytest_collection_modifyitems(config, items):
    """The suite runs twice (scripts/test.sh), the second time with TORCHTPU_MODE=fused: a test that pins the modes
    it runs in (marked pins_mode) would run the same thing twice, so one pass runs it. TORCHTPU_TEST_PINNED=run|skip
    says which (scripts/test.sh gives them to the fused pass, to balance the two passes' times); by default the
    strict pass runs them, so a plain `pytest tests` runs everything. Slow tests that run in the suite's mode but
    need not run in both (marked one_pass("strict") or one_pass("fused")) run in that pass only when the suite is
    split (TORCHTPU_TEST_PINNED set); a plain `pytest tests` runs them in its mode."""
    split = os.environ.get("TORCHTPU_TEST_PINNED")
    mode = os.environ.get("TORCHTPU_MODE", "strict")
    if split:  # scripts/test.sh's two passes: a test marked one_pass(m) runs in the pass of mode m only
        other = pytest.mark.skip(reason="shared over the two passes of the suite (scripts/test.sh): the other runs it")
        for item in items:
            marker = item.get_closest_marker("one_pass")
            if marker and marker.args[0] != mode:
                item.add_marker(other)
    if (split or ("run" if mode == "strict" else "skip")) == "run":
        return
    skip = pytest.mark.skip(reason="pins its own modes: the other pass of the suite (scripts/test.sh) runs it")
    for item in items:
        if item.get_closest_marker("pins_mode"):
            item.add_marker(skip)


def modes_by_pass(*modes):
    """pytest params for a test parametrized over eager modes: each mode's case runs in that mode's pass of the suite
    (scripts/test.sh; debug's in the strict pass), not in both (a plain `pytest tests` runs them all)."""
    return [pytest.param(m, marks=pytest.mark.one_pass("fused" if m == "fused" else "strict")) for m in modes]


@pytest.fixture(autouse=True)
def _fresh_metrics():
    torchtpu.metrics.reset()
    # which uploads varied in size belongs to one program's loop: tests start without the earlier tests' (their
    # values would still be right, but bucketed where a test counts compiles of exact sizes)
    torchtpu.set_shape_buckets(torchtpu.shapes.get_shape_buckets())
    yield


def to_tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def assert_same(cpu_val, tpu_val, rtol=1.3e-6, atol=1e-5):
    """tpu result equals the CPU one: same shape, dtype, values (NaN where CPU has NaN)."""
    if isinstance(cpu_val, (tuple, list)):
        assert len(cpu_val) == len(tpu_val)
        for a, b in zip(cpu_val, tpu_val):
            assert_same(a, b, rtol, atol)
        return
    if not isinstance(cpu_val, torch.Tensor):
        assert cpu_val == tpu_val
        return
    assert tpu_val.device.type == "tpu", tpu_val.device
    torch.testing.assert_close(tpu_val.cpu(), cpu_val, rtol=rtol, atol=atol, equal_nan=True)
