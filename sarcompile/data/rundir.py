"""One writer per directory: an OS lock on a run or partition directory, and the clean-up
of temporary files that a killed writer left behind.

A run directory (the trainer's ``--out``) and a partition directory are each written by
one process at a time. :func:`lock_dir` takes an exclusive ``flock`` on ``DIR/.lock`` for
as long as the returned :class:`DirLock` is held; a second writer is refused at once with
a :class:`~sarcompile.errors.RunDirError` naming the directory and, as the lock file
records them, the holder's pid, host and start time::

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> with lock_dir(d, "training run"):
    ...     lock_dir(d, "training run")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sarcompile.errors.RunDirError: ... is in use by another training run (pid ...

The lock belongs to the open file, so it goes away with the process however it ends
(a kill included): there is never a stale lock to delete by hand. The lock file itself
stays (removing it would let two writers lock two different files).

A job that ``torchrun --max-restarts K`` restarts is the same writer: its lock note
records torchrun's job (``TORCHELASTIC_RUN_ID``), and a restarted worker of that job
waits up to :data:`SAME_JOB_WAIT_S` for the previous start's lock to go (a process still
exiting; on NFS, a lock whose holder's machine died lasts until the server's lease runs
out), where any other writer is refused at once.

Whoever holds the lock may delete the temporary files (``.NAME.*.tmp``, written by
:func:`_atomic_write`) that an earlier, killed writer left: no live writer can be using
them.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from sarcompile.errors import RunDirError

try:  # POSIX; elsewhere directories are not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "DirLock", "lock_dir", "lock_file", "remove_stale_temps"]

LOCK_NAME = ".lock"


SAME_JOB_WAIT_S = 120.0  # beyond NFS's default 90 s lease


POLL_S = 0.2


class DirLock:
    """An exclusive lock on a directory (or a file), held until :meth:`release` (or the
    ``with`` block ends)."""

    def __init__(self, path: Path, fd: int | None):
        self.path = path
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> "DirLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def lock_dir(directory: str | os.PathLike, what: str) -> DirLock:
    """Lock ``directory`` (created if missing) for this process, or raise
    :class:`RunDirError` at once if another process holds it. ``what`` names the kind of
    writer in the message ("training run", "partition run")."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise RunDirError(f"'{directory}' is a file, not a directory: choose a directory for the {what}'s output")
    directory.mkdir(parents=True, exist_ok=True)
    return _lock(directory, directory / LOCK_NAME, what, "directory")


def lock_file(path: str | os.PathLike, what: str) -> DirLock:
    """Lock the file ``path`` as :func:`lock_dir` locks a directory, through ``.NAME.lock``
    beside it (its directory is created if missing): for a run's log written outside its
    run directory, which two runs must not write at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _lock(path, path.parent / f".{path.name}.lock", what, "file")


def _lock(target: Path, lock_path: Path, what: str, kind: str) -> DirLock:
    if fcntl is None:  # pragma: no cover
        return DirLock(target, None)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)  # the umask decides the mode
    except OSError as e:
        raise RunDirError(
            f"cannot create the lock file '{lock_path}' ({e}); is '{lock_path.parent}' writable?"
        ) from None
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    deadline = time.monotonic() + SAME_JOB_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            if job is not None and _holder(fd).get("job") == job and time.monotonic() < deadline:
                time.sleep(POLL_S)  # this job's previous start, still letting go of it
                continue
            holder = _describe_holder(fd)
            os.close(fd)
            raise RunDirError(
                f"'{target}' is in use by another {what}{holder}: wait for it to finish or stop it, "
                f"or choose another {kind}"
            ) from None
    # Ours now: record who holds it, for the message a second writer gets.
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            **({"job": job} if job is not None else {})}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    except OSError:
        pass  # the lock holds without the note
    return DirLock(target, fd)


def _holder(fd: int) -> dict:
    """The lock file's note on its holder ({} where there is none usable)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _describe_holder(fd: int) -> str:
    """' (pid 123 on host, since ...)' from the lock file, or '' if it says nothing usable."""
    info = _holder(fd)
    if "pid" not in info:
        return ""
    where = f" on {info['host']}" if info.get("host") else ""
    since = f", since {info['started']}" if info.get("started") else ""
    return f" (pid {info['pid']}{where}{since})"


def remove_stale_temps(directory: str | os.PathLike, names: list[str]) -> list[Path]:
    """Delete ``.NAME.*.tmp`` in ``directory`` for every ``NAME`` glob in ``names`` (the
    temporary files of interrupted atomic writes); returns what was removed. Call it only
    while holding the directory's lock."""
    removed = []
    for name in names:
        for path in Path(directory).glob(f".{name}.*.tmp"):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            removed.append(path)
    return removed


# -- files written whole or not at all -------------------------------------------------------
def _atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Write ``path`` so that it is either absent, the old file, or the complete new one.

    The data goes to ``.NAME.<random>.tmp`` in the same directory first (what
    :func:`sarcompile.data.rundir.remove_stale_temps` cleans after a kill), created with mode
    0666 less the umask, as ``open`` would create the file (``mkstemp`` would make it 0600).
    """
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _create_temp(path: Path) -> tuple[int, str]:
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temporary file next to '{path}'")


def _fsync_dir(path: Path) -> None:
    """Make renames and removals in ``path`` durable where the OS allows fsync on a directory."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open a directory
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
