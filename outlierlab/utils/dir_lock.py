"""One writer per directory: an advisory lock taken before anything is written there.

Two processes writing into one directory (a resubmitted job, a study launched twice, two loops on one monitor folder)
would write every row twice.  ``lock_dir`` takes an exclusive ``flock`` on a lock file and writes the holder into it
(host, pid, start time, ``SLURM_JOB_ID``); a second writer gets ``DirBusy``, one line naming the holder and what to do.
The kernel drops the lock when its holder dies (the dead holder's record is reported as taken over). A lock still held
although its recorded holder is dead on this host (a forked worker kept the descriptor), or held by an earlier run of
the same scheduler job (a requeue), is broken: the file is replaced and the new one locked. Used for run directories
(``lock_run_dir``: train, probe, evaluate, post-hoc, export) and the loop monitors' folders.

``fcntl`` directly, not ``filelock``: the holder record lives in the lock file, which filelock before 3.30 truncated on
every contending open (tox-dev/filelock#591), and breaking a lock needs the unlink-and-compare-inode dance. Windows has
no ``fcntl``: nothing is locked there.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any


try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

log = logging.getLogger(__name__)


class DirBusy(RuntimeError):
    """Another live writer holds the directory; ``holder`` is its record. ``what`` names the directory's role and
    ``remedy`` says what to do, so the one line fits the caller (a run directory, a monitor folder)."""

    def __init__(self, directory: Path, holder: dict[str, Any] | None, what: str = "directory",
                 remedy: str = "wait for it to finish, stop it, or choose another directory") -> None:
        self.directory, self.holder = Path(directory), holder or {}
        super().__init__(f"{what} {directory} is in use by {describe_holder(holder)}; {remedy}")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def describe_holder(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process (no record yet)"
    job = f", SLURM job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}{job} since {holder.get('started')}"


def read_holder(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(Path(path).read_text() or "null")
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def await_holder(path: Path, timeout: float = 2.0) -> dict[str, Any] | None:
    """The holder's record, waiting up to ``timeout`` s for it to appear (a contender losing the race by microseconds
    can read an empty file); still missing, it is reported as "no record yet"."""
    deadline = time.monotonic() + timeout
    while True:
        holder = read_holder(path)
        if holder is not None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.02)


def pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def reclaim_reason(holder: dict[str, Any] | None) -> str | None:
    """Why a lock still held by ``holder`` may be broken (None: it may not)."""
    if not holder:
        return None
    if holder.get("host") == socket.gethostname() and not pid_alive(holder.get("pid")):
        return f"its holder (pid {holder.get('pid')}) is dead"
    job = os.environ.get("SLURM_JOB_ID")
    if job and holder.get("slurm_job_id") == job:
        return f"it belongs to an earlier run of this SLURM job {job} (requeued)"
    return None


class DirLock:
    """A held lock on one directory; ``release`` (or ``with``) gives it back and removes the file."""

    def __init__(self, path: Path, fd: int | None, record: dict[str, Any]) -> None:
        self.path, self.fd, self.record = path, fd, record

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if read_holder(self.path) == self.record:
                self.path.unlink(missing_ok=True)  # unlink before unlocking: a waiter then locks a dead inode, retries
        finally:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __del__(self) -> None:
        # an owner dropped without release() (a monitor never closed in a notebook) frees its folder with it
        try:
            self.release()
        except Exception:
            pass

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _try_flock(path: Path) -> int | None:
    """An fd holding an exclusive flock on the file now at ``path``, or None if another process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # never O_TRUNC: the holder's record stays readable
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the file was replaced between open and flock (a release or a breaker): lock the new one


def lock_dir(directory: Path, filename: str, what: str = "directory",
             remedy: str = "wait for it to finish, stop it, or choose another directory") -> DirLock:
    """Take ``<directory>/<filename>`` for this process, or raise ``DirBusy`` (one line)."""
    run_dir = Path(directory)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / filename
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": now_iso(),
              "slurm_job_id": os.environ.get("SLURM_JOB_ID") or None}
    if fcntl is None:  # pragma: no cover
        log.warning("no fcntl on this platform: %s is not locked against a second process", run_dir)
        return DirLock(path, None, record)
    try:
        fd = _try_flock(path)
    except OSError as e:  # a file system without flock (some Lustre mounts): run, but say so
        log.warning("cannot lock %s (%s): a second process on this directory would not be stopped", path, e.strerror)
        return DirLock(path, None, record)
    previous = read_holder(path) if fd is not None else await_holder(path)
    if fd is None:
        reason = reclaim_reason(previous)
        if reason is None:
            raise DirBusy(run_dir, previous, what, remedy)
        log.warning("taking over the lock on %s: %s", run_dir, reason)
        path.unlink(missing_ok=True)
        fd = _try_flock(path)
        if fd is None:  # a third process was quicker
            raise DirBusy(run_dir, await_holder(path), what, remedy)
    elif previous and previous.get("pid") != record["pid"]:
        log.warning("taking over the lock on %s from %s, which no longer holds it (killed?)", run_dir,
                    describe_holder(previous))
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
    os.fsync(fd)
    return DirLock(path, fd, record)


#: A run directory's lock file.
LOCK_FILE = "run.lock"


class RunDirBusy(DirBusy):
    """Another live process holds the run directory; ``holder`` is its record."""

    def __init__(self, run_dir: Path, holder: dict | None) -> None:
        super().__init__(run_dir, holder, "run directory",
                         "wait for it to finish, stop it, or choose another directory (hydra.run.dir=)")
        self.run_dir = Path(run_dir)


def lock_run_dir(run_dir: Path) -> DirLock:
    """Take ``<run_dir>/run.lock`` for this process, before anything is written, or raise ``RunDirBusy`` (one line
    naming the holder)."""
    try:
        return lock_dir(run_dir, LOCK_FILE)
    except DirBusy as e:
        raise RunDirBusy(run_dir, e.holder) from None


def is_primary_process() -> bool:
    """Whether this process is rank 0 of its run (the one that locks): DDP ranks >= 1 share rank 0's lock."""
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK"):
        value = os.environ.get(key)
        if value not in (None, "") and value.strip().isdigit() and int(value) != 0:
            return False
    return True
