"""A test that runs far past its time: every thread's native stack (gdb, where the machine has it) and Python stack
go to the log, then the pass ends with a failure instead of hanging until CI's own limit.

Two CI runs hung (2026-12-06, stop 41 and stop 43) with the main thread in jax's block_until_ready at the same test
and every XLA worker idle; faulthandler shows Python frames only, so what XLA's threads waited on was never seen.
tests/conftest.py starts one watcher per pytest process and watches each test's call (not its setup);
TORCHTPU_TEST_HANG_S (seconds, default 600: the slowest call took 161 s in a loaded fresh-clone run, 2026-12-07)
sets when it fires, 0 turns it off."""

from __future__ import annotations

import faulthandler
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(.*?)(?: \(.*)?$")
_THREAD = re.compile(r'^Thread \d+ \(Thread 0x[0-9a-f]+ \(LWP (\d+)\) "([^"]*)"\)')


def condensed(text: str, frames: int = 10) -> str:
    """gdb's `thread apply all bt` cut to each thread's name, its 3 innermost frames and then its C++ frames (XLA's,
    PJRT's, jaxlib's, torch's; the interpreter's own frames left out), function names only."""
    out, depth, kept = [], 0, 0
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            out.append(f"thread {m.group(1)} {m.group(2)}:")
            depth = kept = 0
            continue
        f = _FRAME.match(line)
        if not f:
            continue
        depth += 1
        if kept < frames and (depth <= 3 or "::" in f.group(1)):
            out.append("    " + f.group(1)[:160])
            kept += 1
    return "\n".join(out)


def native_stacks(pid: int) -> str:
    """Every thread's native stack of process `pid` from gdb (batch mode, bounded), or why there is none."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(no gdb on this machine: native stacks not taken)"
    try:
        r = subprocess.run(
            [gdb, "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off", "-ex", "thread apply all bt"],
            capture_output=True,
            text=True,
            timeout=180,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(gdb failed: {e})"
    return r.stdout + r.stderr


class Watchdog:
    def __init__(self, limit_s: float, uncapture=None):
        self.limit_s = limit_s
        self.uncapture = uncapture  # restores the process's stderr (pytest captures fd 2 while a test runs)
        self.current: tuple[str, float] | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="torchtpu-test-watchdog", daemon=True).start()

    def start(self, nodeid: str) -> None:
        with self._lock:
            self.current = (nodeid, time.monotonic())

    def stop(self) -> None:
        with self._lock:
            self.current = None

    def _watch(self) -> None:
        while True:
            time.sleep(5)
            with self._lock:
                cur = self.current
            if cur is None or time.monotonic() - cur[1] < self.limit_s:
                continue
            self._fire(cur[0], time.monotonic() - cur[1])

    def _fire(self, nodeid: str, seconds: float) -> None:
        text = native_stacks(os.getpid())
        if self.uncapture is not None:
            self.uncapture()
        err = sys.__stderr__
        report(f"=== torchtpu watchdog: {nodeid} still running after {seconds:.0f} s ===", text, err)
        err.write("Python stacks:\n")
        faulthandler.dump_traceback(file=err, all_threads=True)
        err.write(f"=== torchtpu watchdog: ending this pytest process (exit 3): {nodeid} hung ===\n")
        err.flush()
        os._exit(3)


def report(head: str, native: str, stream) -> None:
    """Writes a hang's native stacks: whole into a temporary file, condensed into `stream` and into
    TORCHTPU_TEST_HANG_REPORT (scripts/test.sh prints that file last, where CI's tail is)."""
    fd, path = tempfile.mkstemp(prefix="torchtpu-hang-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(native)
    text = f"{head}\nnative stacks (whole gdb output: {path}):\n{condensed(native)}\n"
    where = os.environ.get("TORCHTPU_TEST_HANG_REPORT")
    if where:
        with open(where, "a") as f:
            f.write(text)
    stream.write("\n\n" + text)
    stream.flush()


def run_bounded(cmd: list[str], timeout: float, label: str, env=None) -> subprocess.CompletedProcess | None:
    """Runs `cmd` (its output captured); None if it is still running after `timeout` s: its Python stacks (a child
    that registered faulthandler on SIGUSR1) and native stacks are reported, and it is killed."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)
        time.sleep(2)
        native = native_stacks(p.pid)
        p.kill()
        out, err = p.communicate()
        report(f"=== {label}: no result after {timeout:.0f} s ===", native, sys.__stderr__)
        sys.__stderr__.write(f"its stderr's last lines (Python stacks):\n{err[-6000:]}\n")
        return None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)
