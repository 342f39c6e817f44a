import gc

import pytest
import torch

import torchtpu


def test_memory_allocated_counts_live_device_buffers():
    """As on cuda: the bytes of live device buffers (an empty tensor holds none until it is written)."""
    torch.tpu.empty_cache()
    base = torch.tpu.memory_allocated()
    x = torch.empty(1024, 1024, device="tpu")
    assert torch.tpu.memory_allocated() == base  # lazily zero: no buffer yet
    x.fill_(1.0)
    assert torch.tpu.memory_allocated() == base + 4 * 1024 * 1024
    assert torch.tpu.max_memory_allocated() >= base + 4 * 1024 * 1024
    del x
    assert torch.tpu.memory_allocated() == base
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == base
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base


def test_zeros_hold_no_buffer_and_run_no_program_until_written():
    """torch.zeros (empty + zero_) leaves the storage without a value, which reads as zeros: no program per shape
    (autograd's zero gradients of a new size each cost one before) and no bytes until something is written."""
    torch.tpu.empty_cache()
    base = torch.tpu.memory_allocated()
    c0 = torchtpu.metrics.counters().get("chunks", 0)
    z, zl, f = (
        torch.zeros(3, 7, device="tpu"),
        torch.zeros_like(torch.empty(5, device="tpu")),
        torch.full((4,), 0.0, device="tpu"),
    )
    z.zero_()
    assert torchtpu.metrics.counters().get("chunks", 0) == c0
    assert torch.tpu.memory_allocated() == base
    neg = torch.full((4,), -0.0, device="tpu")  # -0.0 is not what an empty storage reads as
    assert torch.signbit(neg).all().item()
    z[1, 2:] = 5.0
    zl.add_(1)
    ref = torch.zeros(3, 7)
    ref[1, 2:] = 5.0
    assert torch.equal(z.cpu(), ref) and torch.equal(zl.cpu(), torch.ones(5)) and torch.equal(f.cpu(), torch.zeros(4))
    assert torch.tpu.memory_allocated() > base


def test_in_place_updates_donate_their_buffers():
    """An in-place update loop over a large tensor keeps the peak at one copy plus temporaries: the old buffer
    of the overwritten storage is donated to the program that writes the new one."""
    n = 1 << 22  # 16 MiB of float32
    x = torch.ones(n, device="tpu")  # (torch.zeros holds no buffer until written: the loop would add one)
    g = torch.ones(n, device="tpu")
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    for _ in range(10):
        x.add_(g, alpha=0.5)
        x.mul_(0.99)
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.max_memory_allocated() - base < 4 * n // 2, torch.tpu.max_memory_allocated() - base
    assert torchtpu.metrics.counters().get("donated_bytes", 0) >= 4 * n  # (strict: every op; fused: per chunk)
    torch.testing.assert_close(x.cpu(), torch.full((n,), 0.99**10 + sum(0.5 * 0.99 ** (10 - i) for i in range(10))))


def test_a_kept_result_does_not_pin_the_buffers_its_program_overwrote():
    """A compiled step that updates a large state in place and returns a small value: keeping every call's value (a
    decode loop keeps its tokens) must not keep the state's buffer each call wrote, which the next call overwrites
    in place (a kept token pinned the whole KV cache: a copy of it per token, and a second executable)."""
    n = 1 << 20
    state = torch.ones(n, device="tpu")

    @torch.compile(backend="tpu", fullgraph=True)
    def step(x):
        state.mul_(0.5).add_(x)
        return state[:4].sum()

    x = torch.ones(n, device="tpu")
    kept = [step(x) for _ in range(2)]
    torch.tpu.synchronize()
    before = torchtpu.metrics.counters().get("donated_bytes", 0)
    for _ in range(4):
        kept.append(step(x))
        torch.tpu.synchronize()  # each call its own chunk in fused mode too
    assert torchtpu.metrics.counters().get("donated_bytes", 0) - before >= 4 * 4 * n
    assert [round(v.item(), 4) for v in kept] == [4 * (2 - 0.5**k) for k in range(1, 7)]


def test_freed_storages_release_device_buffers():
    torch.tpu.empty_cache()
    base = torch.tpu.memory_stats()["active.all.current"]
    xs = [torch.ones(100, device="tpu") * i for i in range(10)]
    assert torch.tpu.memory_stats()["active.all.current"] >= base + 10
    del xs
    assert torch.tpu.memory_stats()["active.all.current"] == base


def test_empty_is_deterministic_zero_not_garbage():
    x = torch.empty(5, device="tpu")
    assert torch.equal(x.cpu(), torch.zeros(5))


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.pins_mode
@pytest.mark.parametrize("mode,sync_every", [("strict", 50), ("fused", 1)])
def test_long_adamw_run_keeps_memory_flat(mode, sync_every):
    """1,200 AdamW steps with a cosine schedule: the per-op caches key runtime scalars (the learning rate,
    Adam's bias corrections) by type, so host memory, device bytes and every cache stay flat. Fused mode syncs every
    step (a training loop's loss read): with a sync every 50 steps its chunks hold many steps, and their compiles
    (2026-12-01: 6, 31 s of the test's 33) were most of the test's time; tests/executor/test_fused.py covers that
    chunking."""
    from torchtpu import _C, cache

    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 4)
    ).to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 4000)
    x, y = torch.randn(8, 16, device="tpu"), torch.randn(8, 4, device="tpu")
    marks = {}
    with torchtpu.mode(mode):
        for step in range(1200):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            sched.step()
            if step % sync_every == sync_every - 1:  # a logging loop's sync
                torch.tpu.synchronize()
            if step in (399, 1199):  # warm by step 400 (every chunk shape seen); 800 steps compared
                gc.collect()  # tensors of earlier tests caught in reference cycles must not be freed between marks
                marks[step] = (
                    _rss_bytes(),
                    torch.tpu.memory_allocated(),
                    torch.tpu.memory_stats()["active.all.current"],
                    _C._counters()["op_table.entries"],
                    cache.size(),
                )
    (rss0, dev0, bufs0, ops0, exe0), (rss1, dev1, bufs1, ops1, exe1) = marks[399], marks[1199]
    assert (dev1, bufs1, ops1, exe1) == (dev0, bufs0, ops0, exe0)
    assert rss1 - rss0 < 8 * 2**20, f"host RSS grew {(rss1 - rss0) / 2**20:.1f} MB over 800 steps"
