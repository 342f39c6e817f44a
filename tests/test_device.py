import subprocess
import sys

import pytest
import torch


def test_device_module_api():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == 1
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
    assert torch.accelerator.device_count() == 1
    t = torch.ones(2).tpu()
    assert t.is_tpu and t.device == torch.device("tpu:0")
    m = torch.nn.Linear(2, 2).tpu()
    assert m.weight.device.type == "tpu"
    ev = torch.Event(device="tpu")
    ev.record()
    ev.synchronize()


def test_bad_device_index_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"tpu:7.*1 tpu device"):
        torch.empty(2, device="tpu:7")
    with pytest.raises(RuntimeError, match="tpu:7"):
        torch.tpu.set_device(7)


def test_plain_import_torch_autoloads_backend():
    code = "import torch; x = torch.arange(4., device='tpu'); print((x * 2).cpu().tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[0.0, 2.0, 4.0, 6.0]" in out.stdout


def test_transfers_roundtrip_all_dtypes():
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int16,
               torch.int32, torch.int64, torch.bool):
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
