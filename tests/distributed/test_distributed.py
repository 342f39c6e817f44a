"""Distributed training on tpu through the c10d backend "tpu" (torchtpu/distributed.py).

The ranks run in the suite's mode (TORCHTPU_MODE, which they inherit: CI runs the suite in strict and in fused
mode; each test runs in one of the two passes, marked one_pass: those whose collectives cut fused chunks in the
fused pass). Each test starts its ranks itself (tests/distributed/dist_worker.py, 2 processes on loopback, one XLA:CPU
device each, torch's env rendezvous), bounds them in time and kills what is left. Training jobs are compared with the
same training in one process on CPU, computed here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dist_worker  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(job, *args, world=2, timeout=240, env=None):
    """Runs `dist_worker.py job args` as `world` ranks; [(returncode, JSON result or None, stderr)] per rank.
    Each rank writes to files, not pipes: a rank blocked on a full pipe that nobody reads would hang its peers."""
    port = port2 = str(_free_port())
    while port2 == port:  # port2: a job's second default group (collectives)
        port2 = str(_free_port())
    procs, files, late = [], [], False
    with tempfile.TemporaryDirectory() as d:
        try:
            for r in range(world):
                e = dict(
                    os.environ,
                    RANK=str(r),
                    WORLD_SIZE=str(world),
                    LOCAL_RANK=str(r),
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=port,
                    MASTER_PORT2=port2,
                    TORCHTPU_NUM_CPU_DEVICES="1",
                    DIST_WORKER_STACKS_AFTER=str(max(1, timeout - 15)),
                    **(env or {}),
                )
                files.append((open(os.path.join(d, f"{r}.out"), "w+"), open(os.path.join(d, f"{r}.err"), "w+")))
                procs.append(
                    subprocess.Popen(
                        [sys.executable, WORKER, job, *map(str, args)],
                        env=e,
                        stdout=files[-1][0],
                        stderr=files[-1][1],
                        text=True,
                    )
                )
            deadline = time.time() + timeout
            for p in procs:
                p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            late = True
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        texts = []
        for out, err in files:
            out.seek(0), err.seek(0)
            texts.append((out.read(), err.read()))
            out.close(), err.close()
    if late:
        raise AssertionError(
            f"{job}: the ranks did not finish within {timeout} s\n" + "\n---\n".join(err[-8000:] for _, err in texts)
        )
    results = []
    for p, (out, err) in zip(procs, texts):
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        results.append((p.returncode, json.loads(lines[-1]) if lines else None, err))
    return results


def _ok(results):
    bad = [f"rank {r} (exit {rc}):\n{err[-3000:]}" for r, (rc, res, err) in enumerate(results) if rc or res is None]
    assert not bad, "\n---\n".join(bad)
    return [res for _, res, _ in results]


@pytest.mark.one_pass("fused")
def test_each_collective_matches_gloo_on_cpu():
    ranks = _ok(run_ranks("collectives"))
    for rank, res in enumerate(ranks):
        counters = res.pop("counters")
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert not bad, (rank, bad)
        # the reductions XLA has are ops recorded like any other; broadcast, scatter, all-to-all still cut
        assert counters.get("op.torchtpu_c10d::all_reduce", 0) > 0, counters
        assert counters.get("collective.broadcast", 0) > 0 and counters.get("cuts.collective", 0) > 0, counters


def _cpu_reference(steps=dist_worker.STEPS, batch=8):
    """The same training in one process on CPU, over the whole batch."""
    model = dist_worker._gpt()
    opt = dist_worker._opt(model.parameters())
    losses = []
    for x, y in dist_worker.batches(steps, batch):
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().float().sum().item() for k, v in model.state_dict().items()}


def _assert_matches(ranks, ref, per_rank_batch=True, tol=1e-5):
    losses, sums = ref
    got = (
        [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(len(losses))]
        if per_rank_batch
        else ranks[-1]["losses"]
    )
    for a, b in zip(got, losses):
        assert abs(a - b) <= tol * max(1.0, abs(b)), (got, losses)
    for r in ranks:
        for k, v in sums.items():
            assert abs(r["param_sums"][k] - v) <= 10 * tol * max(1.0, abs(v)), (k, r["param_sums"][k], v)


@pytest.mark.one_pass("fused")
def test_ddp_trains_like_one_process_on_cpu():
    _assert_matches(_ok(run_ranks("ddp")), _cpu_reference())


@pytest.mark.one_pass("strict")
def test_fsdp2_trains_like_one_process_on_cpu():
    ranks = _ok(run_ranks("fsdp2"))
    assert ranks[0]["sharded"] == ["DTensor"]
    _assert_matches(ranks, _cpu_reference())


@pytest.mark.one_pass("fused")
def test_fsdp2_mixed_precision_trains_close_to_float32():
    ranks = _ok(run_ranks("fsdp2_mixed"))
    losses, _ = _cpu_reference()
    got = [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(len(losses))]
    assert all(abs(a - b) < 3e-2 * abs(b) for a, b in zip(got, losses)), (got, losses)  # bfloat16 compute
    assert got[-1] < got[0]
    assert ranks[0]["dtypes"] == ["torch.float32"]  # parameters and gradients stay float32


@pytest.mark.one_pass("strict")
def test_tensor_parallel_with_dtensor_trains_like_one_process_on_cpu():
    ranks = _ok(run_ranks("tensor_parallel"))
    _assert_matches(ranks, _cpu_reference(), per_rank_batch=False)
    assert ranks[0]["losses"] == ranks[1]["losses"]


@pytest.mark.one_pass("fused")
def test_two_stage_pipeline_where_ranks_run_different_code():
    ranks = _ok(run_ranks("pipeline"))
    losses, sums = _cpu_reference()
    got = ranks[1]["losses"]
    for a, b in zip(got, losses):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (got, losses)
    for r in ranks:
        for k, v in r["param_sums"].items():
            assert abs(v - sums[k]) <= 1e-4 * max(1.0, abs(sums[k])), (k, v, sums[k])


@pytest.mark.one_pass("strict")
def test_checkpoint_written_by_two_ranks_loads_in_one_process(tmp_path):
    import torch.distributed.checkpoint as dcp

    ranks = _ok(run_ranks("checkpoint_save", str(tmp_path / "ckpt")))
    model = dist_worker._gpt()
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path / "ckpt"))
    model.load_state_dict(state["model"])
    for k, v in model.state_dict().items():
        assert abs(v.float().sum().item() - ranks[0]["param_sums"][k]) <= 1e-5 * max(1.0, abs(v.float().sum().item()))


@pytest.mark.parametrize(
    "seconds,checks",
    [
        pytest.param(20, "1", marks=pytest.mark.one_pass("strict")),
        # torch's default timeout (30 minutes), and no check before the collective: it fails inside its chunk
        pytest.param("default", "0", marks=pytest.mark.one_pass("fused")),
    ],
)
def test_a_lost_rank_makes_the_survivor_raise_within_a_minute(seconds, checks):
    t0 = time.time()
    results = run_ranks("lost_rank", seconds, timeout=180, env={"TORCHTPU_DISTRIBUTED_CHECKS": checks})
    rc0, res0, err0 = results[0]
    assert results[1][0] == 3
    assert rc0 == 0 and res0 is not None, err0[-3000:]  # an error in the collective, not a killed survivor
    assert res0["raised"] is not None, res0
    assert "all_reduce" in res0["raised"] and "rank(s) [1] lost" in res0["raised"], res0
    assert res0["seconds"] < 60, res0
    assert time.time() - t0 < 150


@pytest.mark.one_pass("fused")
def test_collectives_inside_a_compiled_graph_match_eager():
    for rank, res in enumerate(_ok(run_ranks("compiled"))):
        assert res["first"] == [True] * 4 and res["second"] == [True] * 4, (rank, res)
        # the second call runs the collectives inside the compiled program: the process group is not called
        assert res["counters"] == {"compile.program_runs": 1}, (rank, res)


@pytest.mark.one_pass("fused")
def test_eight_ranks_train_with_ddp_and_fsdp2_like_one_process_on_cpu():
    ranks = _ok(run_ranks("data_parallel_many", world=8, timeout=420))
    ref = _cpu_reference()
    for kind in ("ddp", "fsdp2"):
        _assert_matches([{"losses": r[kind], "param_sums": r[f"{kind}_sums"]} for r in ranks], ref, tol=2e-5)


@pytest.mark.one_pass("strict")
def test_four_ranks_train_fsdp_by_tensor_parallel_on_a_2d_mesh_like_one_process_on_cpu():
    ranks = _ok(run_ranks("fsdp_tp_2d", world=4, timeout=300))
    dp0 = [r for r in ranks if r["dp"] == 0][0]
    dp1 = [r for r in ranks if r["dp"] == 1][0]
    _assert_matches([dp0, dp1], _cpu_reference(), tol=2e-5)


@pytest.mark.one_pass("fused")
def test_four_stage_pipeline_trains_like_one_process_on_cpu():
    ranks = _ok(run_ranks("pipeline4", world=4, timeout=300))
    losses, sums = _cpu_reference()
    for a, b in zip(ranks[-1]["losses"], losses):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (ranks[-1]["losses"], losses)
    for r in ranks:
        for k, v in r["param_sums"].items():
            assert abs(v - sums[k]) <= 1e-4 * max(1.0, abs(sums[k])), (k, v, sums[k])


@pytest.mark.one_pass("strict")
def test_dtensor_placements_on_1d_and_2d_meshes():
    for rank, res in enumerate(_ok(run_ranks("dtensor"))):
        assert all(res.values()) and len(res) == 15, (rank, res)


@pytest.mark.one_pass("fused")
def test_mismatched_collectives_raise_on_every_rank_and_the_group_stays_usable():
    for rank, res in enumerate(_ok(run_ranks("mismatch", timeout=120))):
        for kind in ("shape", "dtype", "order"):
            r = res[kind]
            assert r["raised"] and "called different collectives" in r["raised"], (rank, kind, r)
            assert "rank 0: all_reduce" in r["raised"] and r["seconds"] < 10, (rank, kind, r)
        assert res["after"] == [3.0, 3.0]
