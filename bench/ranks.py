"""Starting the ranks of a distributed benchmark on loopback (bench/distributed.py, bench/scaling.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def launch(script: str, args, world: int, timeout: float = 900) -> dict:
    """Runs `python script *args` as `world` ranks (torch's env rendezvous, one XLA:CPU device each); rank 0's last
    JSON line. Raises with a failed rank's stderr; kills what is left."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(world):
        env = dict(
            os.environ,
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(r),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TORCHTPU_NUM_CPU_DEVICES="1",
        )
        cmd = [sys.executable, script, *map(str, args)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs):
        if p.returncode:
            raise RuntimeError(err[-3000:])
    return json.loads([ln for ln in outs[0][0].splitlines() if ln.startswith("{")][-1])
