#!/usr/bin/env bash
# Creates .venv at the repo root, installs the pinned dependencies and builds the extension.
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch==2.13.0 resolves to the CPU wheel on this machine; the pins keep any other torch out.
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q -r requirements-test.txt
# torchvision's PyPI wheel is a CUDA build: --no-deps keeps the pinned CPU torch, and a directory of its own keeps
# it out of site-packages (tests/tools/zoo.py explains why).
if [ ! -d .venv/extra/torchvision/torchvision ]; then
  .venv/bin/python -m pip install -q --no-deps --target .venv/extra/torchvision torchvision==0.28.0
fi
# --no-build-isolation: build against the torch just installed instead of downloading another.
.venv/bin/python -m pip install -q --no-build-isolation --no-deps -e .
.venv/bin/python -c "import torch, torchtpu; print('torchtpu ready:', torch.tpu.get_device_name())"
