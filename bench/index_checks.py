"""What the device-side index checks cost on the README example's GPT training step (strict mode).

Run: .venv/bin/python bench/index_checks.py [--steps 40]
The same model and batches run with the checks (as shipped) and with Trace.check replaced by a no-op (only
possible here: torchtpu has no switch to turn them off), in alternating blocks in one process, so that machine
noise hits both alike. Prints median step times and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import torch  # noqa: E402
import train_gpt  # noqa: E402

from torchtpu import executor  # noqa: E402


def steps(model, opt, data, n):
    times = []
    for x, y in data[:n]:
        t0 = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = train_gpt.GPT().to("tpu")
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [(x.to("tpu"), y.to("tpu")) for x, y in train_gpt.batches(args.steps, 16, 32, 64)]
    real_check = executor.Trace.check
    results = {"with checks": [], "without": []}
    for block in range(4):
        for label in ("with checks", "without"):
            executor.Trace.check = real_check if label == "with checks" else (lambda self, *a, **k: None)
            steps(model, opt, data, 3)  # warm-up: compiles this variant's programs
            results[label] += steps(model, opt, data, args.steps // 4)
    executor.Trace.check = real_check
    on, off = statistics.median(results["with checks"]), statistics.median(results["without"])
    print(f"GPT training step (strict), median of {len(results['without'])} steps each:")
    print(f"  with index checks   {on * 1e3:7.2f} ms")
    print(f"  without             {off * 1e3:7.2f} ms")
    print(f"  cost of the checks  {on / off:7.3f}x ({(on - off) * 1e3:+.2f} ms per step)")


if __name__ == "__main__":
    main()
