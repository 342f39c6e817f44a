"""The advisor (torchtpu.advise), python -m torchtpu run/advise, and --cuda-as-tpu."""

import os
import subprocess
import sys

import torch
import train_gpt

import torchtpu

CUDA_SCRIPT = """
import torch, torch.nn as nn, torch.nn.functional as F
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
assert torch.cuda.is_available() and torch.cuda.device_count() >= 1
torch.cuda.manual_seed(0)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x = torch.randn(64, 16, device="cuda")
y = torch.randint(0, 4, (64,)).to(device)
losses = []
for step in range(12):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=False):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
torch.cuda.synchronize()
assert next(model.parameters()).device.type == "tpu" and x.device.type == "tpu"
assert losses[-1] < losses[0], losses
print("OK", losses[0], losses[-1])
"""


def _gpt_step():
    import train_gpt as gpt

    model, loss_fn = gpt.small_gpt(dropout=False)
    model = model.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = (t.to("tpu") for t in next(iter(gpt.batches(1, 16, 32, 64))))

    def step():
        loss = loss_fn(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def test_advisor_names_what_the_readme_gpt_costs(tmp_path):
    rep = torchtpu.advise(_gpt_step(), png=str(tmp_path / "roof.png"))
    text = rep.text()
    assert "not multiples of 128" in text and "% padding waste  addmm M=512 K=64 N=192" in text
    score_line = 1 + next(i for i, line in enumerate(open(train_gpt.__file__)) if "q @ k.transpose" in line)
    assert "head dim 16" in text and f"train_gpt.py:{score_line}" in text  # d=64 over 4 heads, at the q @ k^T line
    assert "float32 matmul/conv op(s), 100% of the matmul flops" in text
    assert "[small ops]" in text and "[host syncs] 1 in the step" in text and "test_advisor_cli.py" in text
    assert "[recompiles] 0 compile(s)" in text and "[CPU fallbacks] 0" in text
    for g in ("v5e", "v5p", "v6e"):
        assert rep.estimate_s(g) > 0 and g in text
    assert rep.programs and sum(f for f, _ in rep.programs) > 0  # XLA's cost analysis of the step's programs
    assert (tmp_path / "roof.png").read_bytes()[:4] == b"\x89PNG"
    assert "256x256" in torchtpu.advise(_gpt_step(), generation="v6e").text()


def test_advisor_names_recompiles_and_their_cause():
    w = torch.randn(8, 8, device="tpu")
    sizes = iter(range(3, 10))

    def step():
        return (torch.randn(next(sizes), 8, device="tpu") @ w).sum().item()

    rep = torchtpu.advise(step)
    assert rep.recompiles > 0 and "new signature of mm" in rep.text()


def _cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-m", "torchtpu", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_run_cuda_as_tpu_trains_an_unmodified_cuda_script(tmp_path):
    script = tmp_path / "train_cuda.py"
    script.write_text(CUDA_SCRIPT)
    out = _cli("run", "--cuda-as-tpu", "--every", "4", "--mode", "fused", str(script))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout
    assert "[torchtpu] step 4: ops" in out.stderr and "[torchtpu] step 12:" in out.stderr
    assert "12 optimizer steps; in all: ops" in out.stderr and "CPU fallbacks 0" in out.stderr
    red = out.stderr.split("--cuda-as-tpu redirected:")[1]
    for what in (
        "Tensor.cuda",
        "torch.cuda.is_available",
        "randn (device cuda -> tpu)",
        "torch.autocast('cuda')",
        "torch.cuda.synchronize",
    ):
        assert what in red, red


def test_advise_command_reports_on_a_script(tmp_path):
    script = tmp_path / "train_cuda.py"
    script.write_text(CUDA_SCRIPT)
    out = _cli("advise", "--cuda-as-tpu", "--png", str(tmp_path / "r.png"), str(script))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "torchtpu advisor: one step" in out.stderr and "padding waste" in out.stderr
    assert (tmp_path / "r.png").exists()
