"""The main job: train a small GPT, then Hugging Face's GPT-2, on device="tpu" in every mode (and compiled) next to CPU.

Run: python examples/train_gpt.py [--steps 30]
For each model: the loss curves side by side, the largest relative difference to CPU, the time per step of
each mode against CPU, compiles per step, CPU fallbacks and host syncs; the torchtpu metrics report once.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.tril(torch.ones(t, t, device=x.device, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (self.drop(att) @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(y)
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab=64, d=64, heads=4, layers=2, ctx=32):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def batches(steps, batch, ctx, vocab):
    # A learnable toy language: each sequence counts upward mod vocab from a random start.
    g = torch.Generator().manual_seed(1234)
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        seq = (start + torch.arange(ctx + 1)) % vocab
        yield seq[:, :-1], seq[:, 1:]


def hf_gpt2(vocab=64, ctx=32):
    """Hugging Face's GPT-2 (transformers 5.23), tiny config, random init: model code nobody here wrote."""
    import transformers

    cfg = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=ctx,
        n_embd=64,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    transformers.logging.set_verbosity_error()
    model = transformers.GPT2LMHeadModel(cfg)
    # the targets are the next tokens already (batches() shifts them), so the loss is taken on the logits
    return model, lambda m, x, y: F.cross_entropy(m(input_ids=x).logits.reshape(-1, vocab), y.reshape(-1))


def small_gpt(dropout):
    model = GPT()
    if not dropout:
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
    return model, lambda m, x, y: m(x, y)


def train(build, device, steps, mode=None):
    """Trains build()'s model on device (in a torchtpu mode; "compiled" is fused mode with the model under
    torch.compile(backend="tpu")); returns losses, step times, compiles per step."""
    torch.manual_seed(0)
    model, loss_fn = build()
    model = model.to(device)
    fwd = model
    if mode == "compiled":
        torch._dynamo.reset()
        fwd, mode = torch.compile(model, backend="tpu"), "fused"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    losses, t_steps, compiles = [], [], []
    ctx = torchtpu.mode(mode) if mode else _nullcontext()
    with ctx:
        for x, y in batches(steps, 16, 32, 64):
            c0 = torchtpu.metrics.counters().get("compiles", 0)
            t0 = time.perf_counter()
            x, y = x.to(device), y.to(device)
            loss = loss_fn(fwd, x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            t_steps.append(time.perf_counter() - t0)
            compiles.append(torchtpu.metrics.counters().get("compiles", 0) - c0)
    return losses, t_steps, compiles


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def side_by_side(title, build, steps, modes):
    """One model on CPU and on tpu in each mode: the loss table, differences, step times, compiles."""
    print(f"\n=== {title} ===")
    runs = {"cpu": train(build, "cpu", steps)}
    torchtpu.metrics.reset()
    for m in modes:
        runs[m] = train(build, "tpu", steps, mode=m)
    print(f"{'step':>4} " + " ".join(f"{k:>12}" for k in runs))
    for i in range(steps):
        print(f"{i:>4} " + " ".join(f"{runs[k][0][i]:>12.6f}" for k in runs))
    cpu = runs["cpu"][0]
    for m in modes:
        diff = max(abs(a - b) / abs(a) for a, b in zip(cpu, runs[m][0]))
        print(f"max relative loss difference {m} vs cpu: {diff:.2e}")
    cpu_t = sorted(runs["cpu"][1][1:])[len(runs["cpu"][1][1:]) // 2]
    for k, (_, ts, _) in runs.items():
        steady = sorted(ts[1:])[len(ts[1:]) // 2]
        print(
            f"median step time {k:>6}: {steady * 1e3:8.1f} ms ({steady / cpu_t:5.2f}x cpu; "
            f"first step {ts[0] * 1e3:.0f} ms)"
        )
    for m in modes:
        print(f"compiles per step, {m}: {runs[m][2]}")
    c = torchtpu.metrics.counters()
    fallbacks = {k: v for k, v in c.items() if k.startswith("fallback.")}
    print(f"CPU fallbacks: {fallbacks or 0}; host syncs: {c.get('host_syncs', 0)} (the loss .item() per step)")
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    print(f"torchtpu {torchtpu.__version__} on {torch.tpu.get_device_name()}")
    modes = ["strict", "fused", "debug", "compiled"]
    side_by_side("a small GPT written here", lambda: small_gpt(dropout=False), args.steps, modes)
    print(torchtpu.metrics.report())
    side_by_side("Hugging Face GPT-2 (transformers, tiny config)", hf_gpt2, args.steps, modes)
    drop, _, _ = train(lambda: small_gpt(dropout=True), "tpu", 3)
    print(f"\nwith dropout (tpu generator), first losses: {[round(v, 4) for v in drop]}")
    fsdp2_on_two_processes(args.steps)


def fsdp2_on_two_processes(steps):
    """The small GPT with FSDP2 on 2 processes (torchrun, the c10d backend "tpu"): examples/train_fsdp.py."""
    import os
    import subprocess
    import sys

    print("\n=== FSDP2 on 2 processes: torchrun --nproc-per-node 2 examples/train_fsdp.py ===", flush=True)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TORCHTPU_NUM_CPU_DEVICES="1")  # one device per process
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        os.path.join(here, "train_fsdp.py"),
        "--steps",
        str(steps),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    report = [ln for ln in out.stdout.splitlines() if ln.strip() and not ln.startswith("[Gloo]")]
    print("\n".join(report) if report else out.stderr[-3000:])
    if out.returncode:
        raise SystemExit(f"FSDP2 run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")


if __name__ == "__main__":
    main()
