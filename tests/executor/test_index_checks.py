"""Out-of-range indices raise as on cuda: at the op in debug mode, and in strict mode at a later op or the next
synchronization, naming the op, the bad value, the size and the Python line that issued it. XLA alone would
clamp them and train on the wrong rows without a word."""

import pytest
import torch
import torch.nn.functional as F

import torchtpu

T = "tpu"


def _cases():
    w = torch.arange(40.0, device=T).reshape(10, 4)
    i = lambda *v: torch.tensor(v, device=T)  # noqa: E731
    return {
        "index_select": (
            lambda: w.index_select(0, i(1, 12)),
            IndexError,
            r"index 12 is out of bounds for dimension 0 with size 10",
        ),
        "embedding": (lambda: F.embedding(i(99), w), IndexError, r"index 99 .* size 10"),
        "embedding_negative": (lambda: F.embedding(i(-1), w), IndexError, r"index -1 .* size 10"),
        "index": (lambda: w[i(10)], IndexError, r"index 10 is out of bounds for dimension 0 with size 10"),
        "index_negative": (lambda: w[i(-50)], IndexError, r"index -50 .* size 10"),
        "index_2d": (lambda: w[i(1), i(4)], IndexError, r"index 4 is out of bounds for dimension 1 with size 4"),
        "gather": (lambda: w.gather(1, i([7])), RuntimeError, r"index 7 is out of bounds for dimension 1 with size 4"),
        "scatter": (lambda: w.clone().scatter_(1, i([7]), 1.0), RuntimeError, r"index 7"),
        "scatter_add": (
            lambda: w.clone().scatter_add_(1, i([-1]), torch.ones(1, 1, device=T)),
            RuntimeError,
            r"index -1",
        ),
        "scatter_reduce": (
            lambda: w.clone().scatter_reduce_(0, i([11]), torch.ones(1, 1, device=T), "amax"),
            RuntimeError,
            "index 11",
        ),
        "index_put": (lambda: w.clone().index_put_((i(10),), torch.ones(4, device=T)), IndexError, r"index 10"),
        "index_put_accumulate": (
            lambda: w.clone().index_put_((i(-11),), torch.ones(4, device=T), accumulate=True),
            IndexError,
            r"index -11",
        ),
        "index_add": (lambda: w.clone().index_add_(0, i(20), torch.ones(1, 4, device=T)), RuntimeError, r"index 20"),
        "index_copy": (lambda: w.clone().index_copy_(0, i(-1), torch.ones(1, 4, device=T)), IndexError, r"index -1"),
        "index_fill": (lambda: w.clone().index_fill_(0, i(20), 1.0), IndexError, r"index 20"),
        "index_reduce": (
            lambda: w.clone().index_reduce_(0, i(10), torch.ones(1, 4, device=T), "amax"),
            IndexError,
            r"index 10",
        ),
        "take": (lambda: w.take(i(40)), IndexError, r"tried to access index 40 on a tensor of 40 elements"),
        "put": (lambda: w.clone().put_(i(-41), torch.ones(1, device=T)), IndexError, r"index -41"),
        "nll_loss": (lambda: F.nll_loss(w, torch.arange(10, device=T)), IndexError, r"Target 4 is out of bounds"),
        "cross_entropy": (lambda: F.cross_entropy(w, torch.full((10,), -3, device=T)), IndexError, r"Target -3"),
        "one_hot": (lambda: F.one_hot(i(5), 4), RuntimeError, r"index 5"),
        "embedding_bag": (lambda: F.embedding_bag(i(12), w, i(0)), RuntimeError, r"value 12"),
        "embedding_backward": (
            lambda: torch.ops.aten.embedding_dense_backward(torch.ones(1, 4, device=T), i(12), 10, -1, False),
            IndexError,
            r"index 12",
        ),
        "assert_async": (lambda: torch._assert_async(w[0, 0]), RuntimeError, "single nonzero value, but got zero"),
        "assert_async_msg": (lambda: torch._assert_async(w[0, 0] > 1, "mask {empty}"), RuntimeError, "mask {empty}"),
        "masked_scatter": (
            lambda: w.masked_scatter(w > 30, torch.ones(3, device=T)),
            RuntimeError,
            r"at least as many elements as ones in mask \(9\)",
        ),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_strict_raises_at_the_next_synchronization(name):
    fn, exc, msg = _cases()[name]
    with pytest.raises(exc, match=msg) as info:
        fn()
        torch.tpu.synchronize()
    assert "test_index_checks.py:" in str(info.value)  # the user's line that issued the op


@pytest.mark.parametrize("name", ["index_select", "gather", "nll_loss", "index_negative", "take", "assert_async_msg"])
def test_debug_raises_at_the_op(name):
    fn, exc, msg = _cases()[name]
    with torchtpu.mode("debug"):
        with pytest.raises(exc, match=msg) as info:
            fn()
    assert "raises at the op" not in str(info.value) and "test_index_checks.py:" in str(info.value)


def test_valid_and_negative_indices_still_work_without_host_syncs():
    torchtpu.metrics.reset()
    w = torch.arange(40.0).reshape(10, 4)
    t = w.to(T)
    idx = torch.tensor([0, -1, 9, -10])
    y = t[idx.to(T)] + t.index_fill(0, idx.to(T), 0.0).sum() + t.take(idx.to(T)).sum()
    z = F.cross_entropy(t, torch.tensor([0, 1, 2, 3, -100, 0, 1, 2, 3, 0], device=T))
    assert torchtpu.metrics.counters().get("host_syncs", 0) == 0  # checks cost no host sync per op
    ref = w[idx] + w.index_fill(0, idx, 0.0).sum() + w.take(idx).sum()
    torch.testing.assert_close(y.cpu(), ref)
    torch.testing.assert_close(z.cpu(), F.cross_entropy(w, torch.tensor([0, 1, 2, 3, -100, 0, 1, 2, 3, 0])))


def test_error_is_reported_once_and_the_device_keeps_working():
    w = torch.ones(5, device=T)
    with pytest.raises(IndexError):
        w.index_select(0, torch.tensor([7], device=T))
        torch.tpu.synchronize()
    torch.tpu.synchronize()  # reported once, like a device-side assert
    assert (w * 2).sum().item() == 10.0


def test_bad_token_in_a_training_step_names_the_embedding():
    emb = torch.nn.Embedding(16, 8).to(T)
    ids = torch.tensor([[1, 2, 3, 40]], device=T)  # one token id past the vocabulary
    with pytest.raises(IndexError, match=r"embedding .*index 40 .* size 16"):
        loss = emb(ids).sum()
        loss.backward()
        loss.item()


def test_assert_async_checks_on_the_device_without_a_host_sync_or_fallback():
    # Dynamo turns data-dependent checks into _assert_async: it was a CPU fallback with a host sync, which also made
    # each compiled graph holding one run op by op
    torchtpu.metrics.reset()
    torch._assert_async(torch.tensor(2.0, device=T))
    torch._assert_async(torch.tensor(True, device=T), "never")
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        torch._assert_async(torch.ones(2, device=T))
    torch.tpu.synchronize()
    c = torchtpu.metrics.counters()
    assert c.get("host_syncs", 0) == 0 and not any(k.startswith("fallback.") for k in c), c
