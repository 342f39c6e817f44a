"""The disk tier of the executable cache: warm processes compile nothing; bad entries and unsafe directories."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import pytest

import torchtpu
from torchtpu import cache, runtime

TEXT = """module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<4xf32>) -> (tensor<4xf32>) {
    %b = "stablehlo.add"(%a, %a) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%b) : (tensor<4xf32>) -> ()
  }
}
"""


@pytest.fixture
def disk(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("TORCHTPU_CACHE_DIR", str(d))
    cache._reset_disk_state()
    cache.clear()
    yield d
    cache._reset_disk_state()
    cache.clear()


def _run(exe):
    import jax
    import numpy as np

    rt = runtime.get()
    x = jax.device_put(np.arange(4, dtype=np.float32), rt.device(0))
    return np.asarray(rt.execute(exe, [x])[0]).tolist()


def _compile_twice():
    rt = runtime.get()
    first = cache.get_or_compile(rt, TEXT)
    cache.clear()  # a new process: the memory tier is empty
    c0 = torchtpu.metrics.counters().get("compiles", 0)
    second = cache.get_or_compile(rt, TEXT)
    return first, second, torchtpu.metrics.counters().get("compiles", 0) - c0


def test_entry_round_trips_and_a_hit_compiles_nothing(disk):
    _, exe, compiles = _compile_twice()
    assert compiles == 0
    c = torchtpu.metrics.counters()
    assert c.get("cache_hits.disk") == 1 and c.get("compile_seconds_saved", 0) > 0
    assert _run(exe) == [0.0, 2.0, 4.0, 6.0]
    assert oct(os.stat(disk).st_mode & 0o777) == oct(0o700)
    assert [p.name for p in disk.iterdir()] == [cache.key(runtime.get(), TEXT, 0) + ".xla"]


def _damage(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) - 100])
    elif how == "bit-flipped":
        b = bytearray(data)
        b[-500] ^= 0x10
        path.write_bytes(bytes(b))
    elif how == "other version":
        path.write_bytes(data.replace(b'"context": "', b'"context": "9.9.9|', 1))
    elif how == "not ours":
        path.write_bytes(b"\x7fELF" + data[4:])
    elif how == "empty":
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["truncated", "bit-flipped", "other version", "not ours", "empty"])
def test_bad_entry_is_detected_recompiled_and_replaced(disk, how):
    rt = runtime.get()
    cache.get_or_compile(rt, TEXT)
    path = disk / (cache.key(rt, TEXT, 0) + ".xla")
    _damage(path, how)
    cache.clear()
    with pytest.warns(UserWarning, match="compiling anew"):
        exe = cache.get_or_compile(rt, TEXT)
    assert _run(exe) == [0.0, 2.0, 4.0, 6.0]
    assert torchtpu.metrics.counters().get("cache_disk.bad_entries") == 1
    cache.clear()
    with warnings.catch_warnings():  # replaced by a whole, valid entry: the next process loads it silently
        warnings.simplefilter("error")
        c0 = torchtpu.metrics.counters().get("compiles", 0)
        cache.get_or_compile(rt, TEXT)
        assert torchtpu.metrics.counters().get("compiles", 0) == c0


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_directory_writable_by_others_is_refused(disk, mode):
    disk.mkdir()
    os.chmod(disk, mode)
    with pytest.warns(UserWarning, match="writable by others"):
        assert cache.disk_dir() is None
    _, _, compiles = _compile_twice()
    assert compiles == 1 and list(disk.iterdir()) == []


def test_empty_setting_turns_the_disk_tier_off(monkeypatch):
    monkeypatch.setenv("TORCHTPU_CACHE_DIR", "")
    cache._reset_disk_state()
    try:
        assert cache.disk_dir() is None and "empty" in cache.disk_status()["why"]
    finally:
        cache._reset_disk_state()


def test_size_bound_evicts_least_recently_used(disk, monkeypatch):
    rt = runtime.get()
    monkeypatch.setattr(cache, "MAX_DISK_BYTES", 1)
    cache.get_or_compile(rt, TEXT)
    cache.get_or_compile(rt, TEXT.replace('"stablehlo.add"', '"stablehlo.multiply"'))
    names = [p.name for p in disk.iterdir() if p.name.endswith(".xla")]
    assert len(names) <= 1 and torchtpu.metrics.counters().get("cache_disk.evictions", 0) >= 1


SCRIPT = r"""
import json, sys, time
import torch, torch.nn.functional as F
import torchtpu
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(8, 16).to("tpu"), torch.randint(0, 4, (8,)).to("tpu")
losses, first = [], None
for i in range(3):
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
    first = first or time.perf_counter() - t0
c = torchtpu.metrics.counters()
print(json.dumps({"losses": losses, "first": first, "compiles": c.get("compiles", 0),
                  "disk_hits": c.get("cache_hits.disk", 0), "lowerings": c.get("lowerings", 0),
                  "optable_hits": c.get("optable.hits", 0)}))
"""


def _process(cache_dir, mode="fused", timeout=240, script=SCRIPT, stderr=False):
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(cache_dir), TORCHTPU_MODE=mode)
    out = subprocess.run(
        [sys.executable, "-W", "always", "-c", script], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return (result, out.stderr) if stderr else result


@pytest.mark.pins_mode
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_second_process_with_a_warm_cache_compiles_nothing(tmp_path, mode):
    cold = _process(tmp_path / "c", mode)
    warm = _process(tmp_path / "c", mode)
    assert cold["compiles"] > 0 and warm["compiles"] == 0, (cold, warm)
    assert warm["disk_hits"] == cold["compiles"]
    assert warm["losses"] == cold["losses"]
    # the op table on disk: the warm process runs no lowering rule (every signature was lowered by the cold one)
    assert cold["lowerings"] > 0 and warm["lowerings"] == 0 and warm["optable_hits"] == cold["lowerings"]


_LAPACK = """
import json, torch, torchtpu
a = torch.tril(torch.rand(5, 5, generator=torch.Generator().manual_seed(0))) + 2 * torch.eye(5)
b = torch.ones(5, 2)
x = torch.linalg.solve_triangular(a.to("tpu"), b.to("tpu"), upper=False).cpu()
ok = torch.allclose(x, torch.linalg.solve_triangular(a, b, upper=False), atol=1e-5)
print(json.dumps({"ok": ok, "disk_hits": torchtpu.metrics.counters().get("cache_hits.disk", 0)}))
"""


@pytest.mark.pins_mode
def test_a_lapack_program_loaded_from_disk_runs_in_a_fresh_process(tmp_path):
    # XLA:CPU's triangular solve is a custom call into jaxlib's LAPACK wrappers, whose functions jaxlib loads only
    # when it lowers one: a fresh process that loaded the program from disk crashed (SIGSEGV) on its first run
    assert _process(tmp_path / "c", "strict", script=_LAPACK)["ok"]
    warm = _process(tmp_path / "c", "strict", script=_LAPACK)
    assert warm["ok"] and warm["disk_hits"] > 0, warm


@pytest.mark.pins_mode
def test_a_process_killed_while_writing_leaves_nothing_that_breaks_the_next(tmp_path):
    d = tmp_path / "c"
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(d), TORCHTPU_MODE="strict")
    p = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not (d.exists() and len(list(d.iterdir())) >= 3):
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    (d / ".tmp-killed.xla").write_bytes(b"half an entry")  # what a kill between write and rename leaves
    run = _process(d, "strict")
    assert len(run["losses"]) == 3
    assert _process(d, "strict")["compiles"] == 0


COMPILED = r"""
import json, sys
import torch, torch.nn.functional as F
import torchtpu
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                            torch.nn.Linear(32, 4)).to("tpu")
fwd = torch.compile(model, backend="tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(8, 16).to("tpu"), torch.randint(0, 4, (8,)).to("tpu")
losses = []
for i in range(3):
    loss = F.cross_entropy(fwd(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
with torch.no_grad():
    losses.append(fwd(x).sum().item())  # an inference graph too
c = torchtpu.metrics.counters()
print(json.dumps({"losses": losses, "compiles": c.get("compiles", 0), "lowerings": c.get("lowerings", 0),
                  "aot_hits": c.get("compile.aot_cache_hit", 0), "aot_misses": c.get("compile.aot_cache_miss", 0),
                  "bad": c.get("cache_disk.bad_entries", 0)}))
"""


@pytest.fixture(scope="module")
def compiled_cold(tmp_path_factory):
    """One cold process of COMPILED, shared by the tests below (each copies its cache directory and works on the
    copy): a cold process is the slow part of each test."""
    d = tmp_path_factory.mktemp("compiled") / "c"
    return _process(d, "fused", script=COMPILED), d


def _copy_of(cold_dir, tmp_path):
    d = tmp_path / "c"
    shutil.copytree(cold_dir, d)
    os.chmod(d, 0o700)
    return d


@pytest.mark.pins_mode
def test_second_process_compiles_no_graph_again(tmp_path, compiled_cold):
    """torch.compile in a warm process: AOTAutograd's results come from the disk (no joint-graph tracing), the op
    table too (no lowering), the executables too (no XLA compile); same numbers."""
    cold, cold_dir = compiled_cold
    d = _copy_of(cold_dir, tmp_path)
    warm = _process(d, "fused", script=COMPILED)
    assert cold["aot_misses"] == 2 and cold["aot_hits"] == 0, cold  # the training graph pair, the inference graph
    assert warm["aot_hits"] == 2 and warm["aot_misses"] == 0, warm
    assert warm["compiles"] == 0 and warm["lowerings"] == 0, warm
    assert warm["losses"] == cold["losses"]
    assert len(list(d.glob("*.aot"))) == 2 and len(list(d.glob("optable-*.bin"))) == 1


# every kind of damage is tested on executables above; these entries are read by the same checked reader
@pytest.mark.parametrize(
    "which,how", [("*.aot", "bit-flipped"), ("*.aot", "truncated"), ("optable-*.bin", "bit-flipped")]
)
@pytest.mark.pins_mode
def test_bad_graph_or_op_table_entry_is_detected_and_replaced(tmp_path, which, how, compiled_cold):
    cold, cold_dir = compiled_cold
    d = _copy_of(cold_dir, tmp_path)
    damaged = list(d.glob(which))
    assert damaged, sorted(p.name for p in d.iterdir())
    for path in damaged:
        _damage(path, how)
    warm, err = _process(d, "fused", script=COMPILED, stderr=True)
    assert "compiling anew and replacing it" in err, err[-2000:]
    assert warm["losses"] == cold["losses"] and warm["bad"] >= 1
    again = _process(d, "fused", script=COMPILED)  # replaced by whole, valid entries
    assert again["bad"] == 0 and again["aot_hits"] == 2 and again["lowerings"] == 0 and again["compiles"] == 0
