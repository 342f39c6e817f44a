import torch
import torch.nn.functional as F


def test_autocast_casts_matmuls_down_and_keeps_sensitive_ops_in_fp32():
    x = torch.randn(4, 8, device="tpu")
    w = torch.randn(8, 8, device="tpu", requires_grad=True)
    with torch.autocast("tpu"):
        assert torch.get_autocast_dtype("tpu") == torch.bfloat16
        y = x @ w
        assert y.dtype == torch.bfloat16
        assert F.layer_norm(y, (8,)).dtype == torch.float32
        loss = F.cross_entropy(y, torch.zeros(4, dtype=torch.long, device="tpu"))
        assert loss.dtype == torch.float32
    loss.backward()
    assert w.grad.dtype == torch.float32 and w.grad.device.type == "tpu"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = x.cpu() @ w.detach().cpu()
    torch.testing.assert_close(y.float().cpu(), ref.float(), rtol=2e-2, atol=2e-2)
