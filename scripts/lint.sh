#!/usr/bin/env bash
# The tree's format and lint, as CI checks them (scripts/test.sh runs this first): ruff (pyproject.toml [tool.ruff]:
# line length 120, pycodestyle, pyflakes, import order) over the Python, clang-format (.clang-format) over csrc/.
# `bash scripts/lint.sh --fix` rewrites the files instead of failing.
set -euo pipefail
cd "$(dirname "$0")/.."
cpp=$(find csrc -name '*.cpp' -o -name '*.h' | sort)
if [ "${1:-}" = "--fix" ]; then
  .venv/bin/ruff format .
  .venv/bin/ruff check --fix .
  .venv/bin/clang-format -i $cpp
else
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  .venv/bin/clang-format --dry-run -Werror $cpp
  echo "lint: ruff and clang-format pass"
fi
