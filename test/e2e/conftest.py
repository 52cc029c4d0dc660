"""Fixtures for the end-to-end suite: a real ckptfs daemon, real frameworks.

The session builds ckptfs from this checkout (or takes $CKPTFS_BIN), mounts a
fresh store and hands every test a fresh directory under MNT/runs/. Framework calls run either in the
pytest process (the daemon is another process, so mmap from here is safe) or in
subprocesses where a test needs a separate reader (old-version readers, cold
lazy reads).

Nothing here skips: a missing dependency is an import error, and any skipped or
xfailed test turns the run into a failure (see pytest_sessionfinish).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers import is_mounted

# No network, ever: transformers/huggingface_hub must never try the hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]

# Seconds to wait for the daemon to say "serving", and to exit after SIGTERM.
START_TIMEOUT = 60
STOP_TIMEOUT = 120


def _term_with_parent() -> None:
    """In the daemon's child process: SIGTERM it (a clean unmount) if pytest dies,
    e.g. killed by run.sh's time limit, so no mount is left behind."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Daemon:
    """One `ckptfs mount STORE MNT` subprocess. start/stop/restart keep the same
    store and mountpoint, so a restart is a remount with a cold chunk cache."""

    def __init__(self, binary: Path, store: Path, mnt: Path, args=(), log_dir: Path | None = None,
                 prefix=()):
        self.binary = binary
        self.prefix = list(prefix)  # argv before the binary, e.g. a cgroup wrapper
        self.store = store
        self.mnt = mnt
        self.args = list(args)
        self.log_dir = log_dir or store.parent
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self._out_lines: list[str] = []

    @property
    def pid(self) -> int:
        assert self.proc is not None, "daemon not running"
        return self.proc.pid

    def start(self) -> "Daemon":
        assert self.proc is None, "daemon already running"
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self.stderr_path = self.log_dir / f"ckptfs-{self.mnt.name}-{self.starts}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        cmd = [*self.prefix, str(self.binary), "mount", *self.args, str(self.store), str(self.mnt)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr,
                                     stdin=subprocess.DEVNULL, text=True, preexec_fn=_term_with_parent)
        serving = threading.Event()
        self._out_lines = []

        def pump(out, lines):  # keeps the stdout pipe drained for the daemon's lifetime
            for line in out:
                lines.append(line)
                if "serving" in line:
                    serving.set()

        threading.Thread(target=pump, args=(self.proc.stdout, self._out_lines), daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while not serving.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                rc = self.proc.poll()
                if rc is None:
                    self.proc.kill()
                    self.proc.wait()
                self.proc = None
                pytest.fail(f"ckptfs mount did not start (exit {rc}): {self.stderr()}\n"
                            f"stdout: {''.join(self._out_lines)}", pytrace=False)
        return self

    def stop(self) -> None:
        """SIGTERM; the daemon must unmount and exit 0."""
        if self.proc is None:
            return
        gc.collect()  # drop mmaps this process may still hold on the mount
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            subprocess.run(["umount", "-l", str(self.mnt)], check=False)
            self.proc = None
            pytest.fail(f"ckptfs did not exit {STOP_TIMEOUT}s after SIGTERM: {self.stderr()}", pytrace=False)
        self.proc = None
        self._stderr.close()
        assert rc == 0, f"ckptfs exited {rc} after SIGTERM: {self.stderr()}"
        assert not is_mounted(self.mnt), f"{self.mnt} still mounted after the daemon exited"

    def restart(self) -> None:
        self.stop()
        self.start()

    def stderr(self) -> str:
        try:
            return Path(self.stderr_path).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stats(self) -> dict:
        with open(self.mnt / ".ckptfs" / "stats.json") as f:
            return json.load(f)

    def rss(self) -> int:
        """Resident set size of the daemon in bytes (VmRSS)."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc/PID/status")


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def ckptfs_bin(tmp_path_factory) -> Path:
    """bin/ckptfs built from this checkout, or $CKPTFS_BIN if set (to test
    another build)."""
    if os.environ.get("CKPTFS_BIN"):
        return Path(os.environ["CKPTFS_BIN"]).resolve()
    out = tmp_path_factory.mktemp("bin") / "ckptfs"
    p = subprocess.run(["go", "build", "-o", str(out), "./cmd/ckptfs"], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"go build failed:\n{p.stdout}\n{p.stderr}"
    return out


@pytest.fixture(scope="session")
def daemon_factory(ckptfs_bin, tmp_path_factory):
    """daemon_factory(name, *args) -> a started Daemon on a fresh store. All are
    stopped (and must exit 0) at the end of the session, or earlier by the caller."""
    started: list[Daemon] = []

    def make(name: str, *args: str) -> Daemon:
        base = tmp_path_factory.mktemp(name)
        d = Daemon(ckptfs_bin, base / "store", base / "mnt", args, log_dir=base)
        started.append(d)
        return d.start()

    yield make
    errors = []
    for d in started:
        try:
            d.stop()
        except BaseException as e:  # stop every daemon, then report
            errors.append(f"{d.mnt}: {e}")
    assert not errors, "; ".join(errors)


@pytest.fixture(scope="session")
def ckptfs(daemon_factory) -> Daemon:
    """The session's mount: .mnt, .store, .pid, .stats(), .restart()."""
    return daemon_factory("session")


@pytest.fixture
def run_dir(ckptfs, request) -> Path:
    """A fresh directory MNT/runs/<test name>/ on the session mount."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:200]
    d = ckptfs.mnt / "runs" / name
    assert not d.exists(), f"{d} exists already"
    d.mkdir(parents=True)
    return d


# ---------------------------------------------------------------- reporting

_MEASUREMENTS: list[tuple[str, str]] = []
_SKIPPED: list[str] = []


@pytest.fixture(scope="session")
def record():
    """record(name, value): a figure printed in the run's terminal summary."""
    def rec(name: str, value) -> None:
        _MEASUREMENTS.append((name, str(value)))
    return rec


def pytest_runtest_logreport(report):
    if report.skipped:
        _SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    # A skip or xfail means a case CI believes it ran did not: fail the run.
    if _SKIPPED and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _MEASUREMENTS:
        terminalreporter.section("ckptfs e2e measurements")
        for name, value in _MEASUREMENTS:
            terminalreporter.write_line(f"{name}: {value}")
    if _SKIPPED:
        terminalreporter.section("skipped or xfailed (counted as failures)")
        for nodeid in _SKIPPED:
            terminalreporter.write_line(nodeid)
