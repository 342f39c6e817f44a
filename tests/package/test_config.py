"""torchtpu.config: one declaration per knob, read through it everywhere, documented from it."""

from __future__ import annotations

import os
import re
import sys

import pytest

from torchtpu import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gen_config_doc  # noqa: E402


def test_docs_page_is_generated_from_the_declarations():
    with open(os.path.join(ROOT, "docs", "config.md")) as f:
        assert f.read() == gen_config_doc.page(), "docs/config.md is stale: run scripts/gen_config_doc.py"


def test_only_config_reads_the_environment_for_knobs():
    readers = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "torchtpu")):
        for name in files:
            path = os.path.join(dirpath, name)
            if not name.endswith(".py") or path.endswith(os.path.join("torchtpu", "config.py")):
                continue
            for i, line in enumerate(open(path), 1):
                if re.search(r"environ(\.get)?[\[(]\s*['\"]TORCHTPU_", line):
                    readers.append(f"{os.path.relpath(path, ROOT)}:{i}")
    assert not readers, f"read these through torchtpu.config: {readers}"


def test_every_knob_parses_its_default_and_rejects_bad_values(monkeypatch):
    for k in config.KNOBS.values():
        monkeypatch.delenv(k.env, raising=False)
        if k.name not in config._set:
            config.get(k.name)
    monkeypatch.setenv("TORCHTPU_FALLBACK", "sometimes")
    with pytest.raises(ValueError, match="TORCHTPU_FALLBACK='sometimes': expected one of warn, error, silent"):
        config.get("fallback")
    monkeypatch.setenv("TORCHTPU_FUSED_MAX_OPS", "many")
    with pytest.raises(ValueError, match="TORCHTPU_FUSED_MAX_OPS='many': expected int"):
        config.get("fused_max_ops")
    with pytest.raises(KeyError, match="no knob 'modes'"):
        config.set("modes", "fused")


def test_set_tells_the_listeners_and_overrides_the_environment(monkeypatch):
    seen = []
    config.on_change("buckets_debug", seen.append)
    monkeypatch.setenv("TORCHTPU_BUCKETS_DEBUG", "1")
    assert config.get("buckets_debug") is True
    try:
        config.set("buckets_debug", False)
        assert config.get("buckets_debug") is False and seen == [False]
    finally:
        config._set.pop("buckets_debug", None)
        config._listeners["buckets_debug"].remove(seen.append)
