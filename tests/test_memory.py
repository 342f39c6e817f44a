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
