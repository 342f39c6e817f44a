import subprocess
import sys

import pytest
import torch


def test_device_module_api():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == 2  # tests/conftest.py: TORCHTPU_NUM_CPU_DEVICES=2
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device(0)
    with torch.tpu.device(0):
        assert torch.tpu.current_device() == 0
    torch.tpu.init()
    assert torch.tpu.is_initialized()
    assert "cpu" in torch.tpu.get_device_name()  # names the PJRT platform underneath
    assert torch.tpu.get_device_properties(0).platform == "cpu"
    assert torch.bfloat16 in torch.tpu.get_amp_supported_dtype()
    torch.tpu.synchronize()
    s = torch.tpu.current_stream()
    assert s.device == torch.device("tpu", 0)


def test_accelerator_and_methods():
    assert torch.accelerator.current_accelerator().type == "tpu"
    assert torch.accelerator.device_count() == 2
    t = torch.ones(2).tpu()
    assert t.is_tpu and t.device == torch.device("tpu:0")
    m = torch.nn.Linear(2, 2).tpu()
    assert m.weight.device.type == "tpu"
    ev = torch.Event(device="tpu")
    ev.record()
    ev.synchronize()


def test_bad_device_index_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"tpu:7.*2 tpu device"):
        torch.empty(2, device="tpu:7")
    with pytest.raises(RuntimeError, match="tpu:7"):
        torch.tpu.set_device(7)


def test_plain_import_torch_autoloads_backend():
    code = "import torch; x = torch.arange(4., device='tpu'); print((x * 2).cpu().tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[0.0, 2.0, 4.0, 6.0]" in out.stdout


def test_transfers_roundtrip_all_dtypes():
    for dt in (
        torch.float32,
        torch.float64,
        torch.bfloat16,
        torch.float16,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    ):
        x = (torch.arange(-6, 6).reshape(3, 4) * 3).to(dt)
        t = x.to("tpu")
        assert t.dtype == dt
        assert torch.equal(t.cpu(), x), dt


def test_64bit_types_keep_their_width():
    big = torch.tensor([2**40 + 1, -(2**50) - 3], dtype=torch.int64)
    assert torch.equal((big.to("tpu") + 1).cpu(), big + 1)
    f = torch.tensor([1.0 + 2**-40], dtype=torch.float64)
    assert (f.to("tpu") * 1.5).cpu().item() == (f * 1.5).item()


def test_item_print_and_scalars():
    t = torch.tensor([[1.5, 2.0], [3.0, 4.0]], device="tpu")
    assert t[1, 0].item() == 3.0
    assert "tpu:0" in repr(t) and "1.5000" in repr(t)
    z = torch.tensor(7, device="tpu")
    assert z.dim() == 0 and int(z) == 7
    e = torch.empty(0, 3, device="tpu")
    assert e.cpu().shape == (0, 3)


# -- every device index works as tpu:0 does ---------------------------------------------------------------
def _pjrt_device(t):
    from torchtpu import executor

    (d,) = executor.buffer_of(t).devices()
    return d.id


def test_factories_and_moves_honour_the_device_index():
    for make in (
        lambda: torch.ones(3, device="tpu:1"),
        lambda: torch.empty(2, 3, device="tpu:1"),
        lambda: torch.arange(4, device="tpu:1"),
        lambda: torch.randn(5, device="tpu:1"),
        lambda: torch.zeros(2, device=torch.device("tpu", 1)),
        lambda: torch.ones(3).to("tpu:1"),
        lambda: torch.ones(3).tpu(1),
    ):
        t = make()
        assert t.device == torch.device("tpu:1")
        assert (t + 1).device == torch.device("tpu:1")
        assert _pjrt_device(t * 2) == 1  # the op ran on PJRT device 1
    with torch.tpu.device(1):
        assert torch.tpu.current_device() == 1
        assert torch.ones(2, device="tpu").device == torch.device("tpu:1")
    assert torch.tpu.current_device() == 0
    assert torch.ones(2, device="tpu").device == torch.device("tpu:0")


def test_set_device_and_current_device():
    try:
        torch.tpu.set_device(1)
        assert torch.tpu.current_device() == 1
        t = torch.zeros(2, device="tpu")
        assert t.device == torch.device("tpu:1") and _pjrt_device(t + 1) == 1
    finally:
        torch.tpu.set_device(0)


def test_copies_between_devices_and_mixing_is_an_error():
    x = torch.arange(12.0).reshape(3, 4)
    a = x.to("tpu:1")
    b = a.to("tpu:0")
    assert b.device == torch.device("tpu:0") and torch.equal(b.cpu(), x)
    assert _pjrt_device(b + 0) == 0
    c = a.t().to("tpu:0", torch.float64)  # a strided view, with a dtype change
    assert torch.equal(c.cpu(), x.t().double())
    d = torch.zeros(4, 3, device="tpu:1")
    d[1:3].copy_(b.t()[1:3])  # tpu:0 -> a slice of a tpu:1 tensor
    ref = torch.zeros(4, 3)
    ref[1:3] = x.t()[1:3]
    assert torch.equal(d.cpu(), ref)
    assert torchtpu_counter("transfers.d2d") >= 2
    with pytest.raises(RuntimeError, match="tpu:1 and tpu:0"):
        a + b


def torchtpu_counter(name):
    import torchtpu

    return torchtpu.metrics.counters().get(name, 0)


def test_training_on_tpu1_and_memory_per_device():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    ref = torch.nn.Linear(4, 3)
    ref.load_state_dict(m.state_dict())
    m.to("tpu:1")
    assert m.weight.device == torch.device("tpu:1")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    for model, o, inp in ((m, opt, x.to("tpu:1")), (ref, ropt, x)):
        for _ in range(3):
            o.zero_grad()
            model(inp).pow(2).mean().backward()
            o.step()
    assert m.weight.grad.device == torch.device("tpu:1")
    torch.testing.assert_close(m.weight.cpu(), ref.weight, rtol=1e-5, atol=1e-6)
    base0, base1 = torch.tpu.memory_allocated(0), torch.tpu.memory_allocated(1)
    big = torch.ones(1024, 256, device="tpu:1")
    assert torch.tpu.memory_allocated(1) == base1 + big.nbytes
    assert torch.tpu.memory_allocated(0) == base0
    del big
    assert torch.tpu.memory_allocated(1) == base1
