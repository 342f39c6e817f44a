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


def test_grad_scaler_runs_on_tpu_without_fallback():
    import torchtpu

    torch.manual_seed(0)
    m = torch.nn.Linear(4, 4).to("tpu")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("tpu", init_scale=2.0**16, growth_interval=2)
    for _ in range(4):
        with torch.autocast("tpu", dtype=torch.float16):
            loss = m(torch.randn(8, 4, device="tpu")).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert scaler.get_scale() == 2.0**18  # grew twice: every 2 finite steps
    # an infinite gradient skips the step and backs the scale off
    w0 = m.weight.detach().cpu().clone()
    (m.weight.sum() * float("inf")).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(m.weight.detach().cpu(), w0) and scaler.get_scale() == 2.0**17
    assert not any(k.startswith("fallback.") for k in torchtpu.metrics.counters())
