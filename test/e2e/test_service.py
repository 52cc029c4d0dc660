"""ckptfs as a service, with real torch: an ordinary user mounts through
fusermount3 and saves/loads a checkpoint; another user is refused; the
README's quick start runs as written and prints what the README shows.

The users are created here (useradd) and removed after. Their Python is this
venv's: when it lives under a directory other users cannot enter (root's home
is 0700), the user's process runs in a private mount namespace in which that
directory is replaced by a 0711 tmpfs holding bind mounts of just the venv and
its base interpreter (unshare + setpriv), so nothing on the machine is
loosened.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- users


class User:
    def __init__(self, name: str):
        self.name = name
        out = subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True)
        self.uid = int(out.stdout)
        self.gid = int(subprocess.run(["id", "-g", name], capture_output=True, text=True, check=True).stdout)


@pytest.fixture
def make_user():
    made: list[str] = []

    def make(tag: str) -> User:
        name = f"cke{os.getpid() % 100000}{tag}"
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
                       check=True, capture_output=True)
        made.append(name)
        return User(name)

    yield make
    for name in made:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def _closed_ancestor(p: Path) -> Path | None:
    """The highest ancestor of p that others cannot traverse (no o+x), if any."""
    found = None
    for parent in reversed(p.resolve().parents):
        if parent == Path("/"):
            continue
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            found = parent
            break
    return found


def python_as(user: User, script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs this venv's python with script as user (see the module doc)."""
    py = Path(sys.executable)
    env = {"PATH": f"{py.parent}:/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    drop = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--"]
    cmd = [*drop, str(py), "-c", script, *args]
    needed = [Path(sys.prefix), Path(sys.base_prefix)]
    closed = {c for c in (_closed_ancestor(p) for p in needed) if c is not None}
    if closed:
        assert len(closed) == 1, f"the venv spans several closed directories: {closed}"
        top = closed.pop()
        keep = sorted({top / p.resolve().relative_to(top).parts[0] for p in needed})
        lines = ["set -e", "stash=$(mktemp -d)"]
        for i, k in enumerate(keep):  # reach the originals before hiding them
            lines += [f"mkdir -p $stash/{i}", f"mount --bind '{k}' $stash/{i}"]
        lines.append(f"mount -t tmpfs -o mode=0711 ckptfs-e2e '{top}'")
        for i, k in enumerate(keep):
            lines += [f"mkdir -p '{k}'", f"mount --bind $stash/{i} '{k}'"]
        lines.append('exec "$@"')
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines), "sh", *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd="/")


@pytest.fixture
def shared_bin(ckptfs_bin, tmp_path_factory):
    """A directory every user can enter, holding a copy of the binary (the
    session's build lives under root's 0700 pytest directory)."""
    d = Path(tempfile.mkdtemp(prefix="ckptfs-e2e-svc-"))
    d.chmod(0o755)
    b = d / "ckptfs"
    shutil.copy2(ckptfs_bin, b)
    b.chmod(0o755)
    yield d, b
    shutil.rmtree(d, ignore_errors=True)


def _mounted(mnt: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(mnt) for line in f)


# ---------------------------------------------------------------- tests

SAVE_LOAD = r"""
import sys, torch
path = sys.argv[1]
torch.manual_seed(0)
sd = {"embed": torch.randn(512, 256), "head": torch.randn(256, 10).to(torch.bfloat16), "step": torch.tensor(7)}
torch.save(sd, path)
back = torch.load(path, weights_only=True)
lazy = torch.load(path, mmap=True, weights_only=True)
for k in sd:
    assert torch.equal(back[k], sd[k]) and torch.equal(lazy[k], sd[k]), k
print("ok", sum(t.numel() * t.element_size() for t in sd.values()))
"""

READ = r"""
import sys, torch
try:
    torch.load(sys.argv[1], weights_only=True)
except PermissionError as e:
    print("refused", e.errno)
else:
    print("read it")
"""


def test_ordinary_user_mounts_and_saves_with_torch(make_user, shared_bin):
    alice, bob = make_user("a"), make_user("b")
    base, binary = shared_bin
    home = base / "alice"
    home.mkdir()
    os.chown(home, alice.uid, alice.gid)
    store, mnt = home / "store", home / "mnt"
    mnt.mkdir()
    os.chown(mnt, alice.uid, alice.gid)

    def as_alice(*cmd):
        return ["setpriv", f"--reuid={alice.uid}", f"--regid={alice.gid}", "--clear-groups", "--", *cmd]

    log = open(home / "daemon.log", "wb")
    daemon = subprocess.Popen(as_alice(str(binary), "mount", str(store), str(mnt)), stdout=subprocess.PIPE,
                              stderr=log, text=True, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    try:
        line = daemon.stdout.readline()
        assert "serving" in line, f"alice's mount: {line!r} {(home / 'daemon.log').read_text()}"
        with open("/proc/self/mountinfo") as f:
            entry = next(l for l in f if l.split()[4] == str(mnt))
        assert f"user_id={alice.uid}" in entry and "fuse.ckptfs" in entry, entry
        assert stat.S_IMODE(store.stat().st_mode) == 0o700
        assert stat.S_IMODE((store / "catalog.db").stat().st_mode) == 0o600

        ckpt = mnt / "runs" / "run-1" / "model.pt"
        subprocess.run(as_alice("mkdir", "-p", str(ckpt.parent)), check=True)
        p = python_as(alice, SAVE_LOAD, str(ckpt))
        assert p.returncode == 0 and p.stdout.startswith("ok"), f"alice's torch.save/load: {p.stdout}\n{p.stderr}"

        # bob, and root, are refused by the kernel: the mount is private.
        p = python_as(bob, READ, str(ckpt))
        assert p.stdout.strip() == "refused 13", f"bob: {p.stdout}\n{p.stderr}"
        with pytest.raises(PermissionError):
            ckpt.stat()

        # alice's tools reach her daemon; the data survives her remount.
        out = subprocess.run(as_alice(str(binary), "stats", "--json", str(mnt)), capture_output=True, text=True)
        assert out.returncode == 0 and '"files": 1' in out.stdout, out.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(60)
        log.close()
    assert rc == 0, (home / "daemon.log").read_text()
    assert not _mounted(mnt)

    daemon = subprocess.Popen(as_alice(str(binary), "mount", "--background", "--log", str(home / "bg.log"),
                                       str(store), str(mnt)), env={"PATH": "/usr/bin:/bin"}, cwd="/")
    assert daemon.wait(60) == 0, (home / "bg.log").read_text()
    try:
        p = python_as(alice, "import sys, torch; sd = torch.load(sys.argv[1], weights_only=True); print(sd['step'].item())",
                      str(ckpt))
        assert p.stdout.strip() == "7", p.stderr
    finally:
        subprocess.run(as_alice("fusermount3", "-u", str(mnt)), check=True)
    deadline = time.monotonic() + 30
    while "unmounted" not in (home / "bg.log").read_text():
        assert time.monotonic() < deadline, (home / "bg.log").read_text()
        time.sleep(0.1)


def _readme_quickstart() -> tuple[list[str], str]:
    """The shell blocks of the README's quick start that run the example (the
    ones before the sample output), and that sample output."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    shell, sample = [], None
    for lang, body in blocks:
        if lang == "" and sample is None and shell:
            sample = body
            break
        if lang == "sh":
            shell.append(body)
    assert shell and sample, "README's quick start: no shell blocks followed by the sample output"
    return shell, sample


def _stats_figures(out: str) -> dict[str, str]:
    """stats' lines as name → first value, leaving out what differs between
    runs (paths, timings, compression of random weights)."""
    keep = {"files", "dirs", "logical_bytes", "unique_bytes", "chunks", "dedup", "chunk_size", "format_version"}
    figures = {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] in keep:
            figures[parts[0]] = parts[1] if parts[0] != "dedup" else parts[2]
    return figures


def test_readme_quickstart_runs_as_written(tmp_path):
    """Pastes the quick start into bash (from the repository root, with this
    venv's python3 first in PATH and a fresh HOME) and checks that stats
    printed what the README says it prints."""
    shell, sample = _readme_quickstart()
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, HOME=str(home), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    # Go's caches are the machine's, not part of the example (a fresh HOME
    # would download every module again).
    for var in ("GOMODCACHE", "GOCACHE", "GOPATH"):
        env[var] = subprocess.run(["go", "env", var], capture_output=True, text=True, check=True).stdout.strip()
    script = "set -euo pipefail\n" + "\n".join(shell)
    mnt = home / "ckpt" / "mnt"
    try:
        p = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    finally:
        if _mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], check=False)
    assert p.returncode == 0, f"quick start failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    got, want = _stats_figures(p.stdout), _stats_figures(sample)
    assert len(want) >= 7, f"the README's sample output lacks the figures: {sample}"
    assert got == want, f"stats printed\n{p.stdout}\nthe README shows\n{sample}"
    # The daemon was told to unmount; it exits after committing.
    deadline = time.monotonic() + 30
    log = home / ".cache" / "ckptfs" / "mount.log"
    while True:
        text = log.read_text() if log.exists() else ""
        if "unmounted" in text:
            break
        assert time.monotonic() < deadline, f"the quick start's daemon did not exit:\n{text}"
        time.sleep(0.1)
