import torch

import torchtpu


def test_memory_allocated_tracks_live_storages():
    torch.tpu.empty_cache()
    base = torch.tpu.memory_allocated()
    x = torch.empty(1024, 1024, device="tpu")
    assert torch.tpu.memory_allocated() == base + 4 * 1024 * 1024
    assert torch.tpu.max_memory_allocated() >= base + 4 * 1024 * 1024
    del x
    assert torch.tpu.memory_allocated() == base
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == base
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base


def test_freed_storages_release_device_buffers():
    from torchtpu import storage as S

    torch.tpu.empty_cache()
    n0 = len(S.live_buffers())
    xs = [torch.ones(100, device="tpu") * i for i in range(10)]
    assert len(S.live_buffers()) >= n0 + 10
    del xs
    torch.tpu.empty_cache()
    assert len(S.live_buffers()) == n0


def test_empty_is_deterministic_zero_not_garbage():
    x = torch.empty(5, device="tpu")
    assert torch.equal(x.cpu(), torch.zeros(5))


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_long_adamw_run_keeps_memory_flat():
    """2,000 AdamW steps with a cosine schedule: the per-op caches key runtime scalars (the learning rate,
    Adam's bias corrections) by type, so host memory, device bytes and every cache stay flat."""
    from torchtpu import cache
    from torchtpu import executor as X
    from torchtpu import registry as R
    from torchtpu import storage as S

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                            torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 4000)
    x, y = torch.randn(8, 16, device="tpu"), torch.randn(8, 4, device="tpu")
    marks = {}
    for step in range(2000):
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        sched.step()
        if step in (499, 1999):
            torch.tpu.synchronize()
            marks[step] = (_rss_bytes(), torch.tpu.memory_allocated(), len(S.live_buffers()), len(R._META_CACHE),
                           cache.size(), len(X._scalars))
    (rss0, dev0, bufs0, meta0, exe0, sc0), (rss1, dev1, bufs1, meta1, exe1, sc1) = marks[499], marks[1999]
    assert (dev1, bufs1, meta1, exe1) == (dev0, bufs0, meta0, exe0)
    assert sc1 <= X._SCALAR_CACHE_MAX
    assert rss1 - rss0 < 8 * 2**20, f"host RSS grew {(rss1 - rss0) / 2**20:.1f} MB over 1,500 steps"
