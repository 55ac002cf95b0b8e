"""Claiming a dump folder: which folder a run writes to, and one writer per rank file at a time.

``claim_dump_dir`` picks the folder (a fresh ``_N`` sibling rather than touching a finished dump) and takes the
rank's lock; ``DumpLock`` is that lock (``fcntl`` where available, an ``O_EXCL`` file elsewhere). A second
writer gets ``DumpInUseError`` naming the holder; nothing finished is renumbered, merged or deleted.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import time
import warnings
from contextlib import suppress
from pathlib import Path
from types import ModuleType

from msprobe_nb.store.hdf5_layout import RANK_FILE_RE

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows: locks are O_EXCL files
    fcntl = None

__all__ = ["DumpInUseError", "DumpLock", "claim_dump_dir", "lock_held", "resolve_dump_dir"]


def _holds_dump(path: Path) -> list[Path]:
    """The kit rank files directly inside ``path`` (empty if none or not a directory)."""
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if RANK_FILE_RE.match(p.name) and p.is_file())


def _file_rank(name: str) -> int:
    """The rank in a kit rank file's name (one that ``_holds_dump`` listed)."""
    m = RANK_FILE_RE.match(name)
    if m is None:
        raise ValueError(f"{name!r} is not a rank file name")
    return int(m.group(1))


class DumpInUseError(FileExistsError):
    """Another live process writes this rank of the dump folder (it holds ``rank<N>.lock`` there)."""


def _lock_path(dump_dir: Path, rank: int) -> Path:
    return dump_dir / f"rank{rank}.lock"


def _holder(lock: Path) -> str:
    """Who holds ``lock``, from what it wrote into it (``pid 123 on host``)."""
    try:
        info = json.loads(lock.read_text(encoding="utf-8") or "{}")
        return f"pid {int(info['pid'])} on {info.get('host', '?')}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that did not say which (no pid in the lock file yet)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but not ours to signal
        return True
    return True


class DumpLock:
    """The claim of one rank of a dump folder: ``<folder>/rank<N>.lock``, held while a process writes it.

    With ``fcntl`` the file is held with ``flock``, which the system drops when the holder dies, so the lock
    of a killed run is simply taken over; the file holds the holder's pid and host, for error messages.
    ``release()`` removes it. Without ``fcntl`` (Windows) it is an ``O_EXCL`` file, taken over when its pid
    is dead on this host.
    """

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path: Path | None = path
        self._fd = fd

    @classmethod
    def claim(cls, dump_dir: str | Path, rank: int = 0) -> DumpLock:
        """Claim rank ``rank`` of ``dump_dir`` (which must exist); DumpInUseError if a live process holds it."""
        path = _lock_path(Path(dump_dir), int(rank))
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        if fcntl is None:
            return cls._claim_excl(path, me)
        busy = 0
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise
                busy += 1
                if busy < 5:  # another process may only be checking whether it is held (lock_held)
                    time.sleep(0.01)
                    continue
                raise DumpInUseError(errno.EEXIST, f"dump path {str(path.parent)!r} is in use: rank {rank} is "
                                     f"being written by {_holder(path)} (lock {path.name}); pass another "
                                     "dump_path, or on_exists='new' to write beside it") from None
            try:  # its holder may have released (unlinked) it between our open and our flock: retry
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, me)
            return cls(path, fd)

    @classmethod
    def _claim_excl(cls, path: Path, me: bytes) -> DumpLock:
        for _ in range(3):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                try:
                    info = json.loads(path.read_text(encoding="utf-8"))
                    stale = info.get("host") == socket.gethostname() and not _pid_alive(int(info["pid"]))
                except (OSError, ValueError, KeyError, TypeError):
                    stale = False
                if stale:
                    path.unlink(missing_ok=True)
                    continue
                raise DumpInUseError(errno.EEXIST, f"dump path {str(path.parent)!r} is in use: being written by "
                                     f"{_holder(path)} (lock {path.name})") from None
            os.write(fd, me)
            os.close(fd)
            return cls(path, None)
        raise DumpInUseError(errno.EEXIST, f"dump path {str(path.parent)!r}: cannot take over {path.name}")

    def release(self) -> None:
        """Give the rank back (remove the lock file). Safe to call twice."""
        path, self.path = self.path, None
        if path is None:
            return
        with suppress(OSError):
            path.unlink()
        if self._fd is not None:
            with suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __repr__(self) -> str:
        return f"DumpLock({str(self.path)!r})" if self.path else "DumpLock(released)"


def lock_held(dump_dir: Path, rank: int) -> bool:
    """Whether a live process, this one included, holds rank ``rank`` of ``dump_dir``. (``flock`` locks belong
    to an open file, so this process's own lock shows too; the check holds a shared lock for a moment, which
    ``DumpLock.claim`` allows for by trying again.)"""
    path = _lock_path(dump_dir, rank)
    if fcntl is None:
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            return info.get("host") != socket.gethostname() or _pid_alive(int(info["pid"]))
        except FileNotFoundError:
            return False
        except (OSError, ValueError, KeyError, TypeError):
            return True
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock at once
    return False


def _unusable(path: Path, e: OSError) -> OSError:
    """The OSError (same errno, so the same subclass) saying why the dump folder ``path`` cannot be used."""
    up = path
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        why = f"{str(up)!r} is a file, not a folder"
    elif e.errno == errno.EROFS:
        why = f"{str(up)!r} is on a read-only file system"
    elif e.errno in (errno.EACCES, errno.EPERM):
        why = f"{str(up)!r} is not writable (permission denied)"
    else:
        why = os.strerror(e.errno) if e.errno else str(e)
    return OSError(e.errno, f"dump path {str(path)!r} cannot be used: {why}")


def claim_dump_dir(path: str | Path, on_exists: str = "new", rank: int = 0) -> tuple[Path, DumpLock, bool]:
    """Pick the directory a new dump goes to, create it and claim rank ``rank`` of it, atomically.

    A path is taken when it holds rank*.h5 files (a dump), or when a live process holds the rank (it is
    writing there and has no file yet). ``on_exists`` says what to do then: ``"new"`` uses the next free
    sibling ``<path>_1``, ``<path>_2``... (with a warning); ``"error"`` raises FileExistsError (DumpInUseError
    when a process holds it); ``"overwrite"`` deletes the old rank files (with a warning) but never one a
    live process writes: DumpInUseError for this rank, other ranks' files are kept. Returns the directory,
    the lock (release it when done) and whether the directory was created.
    """
    if on_exists not in ("new", "error", "overwrite"):
        raise ValueError(f"on_exists must be 'new', 'error' or 'overwrite', not {on_exists!r}")
    base = path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"dump path {str(path)!r} exists and is not a directory")
    i = 0
    while True:
        old = _holds_dump(path)
        if old and on_exists == "error":
            live = (f", rank {rank} being written now by {_holder(_lock_path(path, rank))}"
                    if lock_held(path, rank) else "")
            raise FileExistsError(
                f"dump path {str(path)!r} already holds a dump ({', '.join(p.name for p in old[:4])}"
                f"{', ...' if len(old) > 4 else ''}{live}); pass on_exists='new' or 'overwrite', or another path")
        if not (old and on_exists == "new"):
            created = not path.exists()
            try:
                path.mkdir(parents=True, exist_ok=True)
                lock = DumpLock.claim(path, rank)
            except DumpInUseError:
                if on_exists != "new":
                    raise
            except OSError as e:
                raise _unusable(path, e) from None
            else:
                break
        while True:  # the next sibling that is not a file
            i += 1
            path = base.with_name(f"{base.name}_{i}")
            if not path.exists() or path.is_dir():
                break
    if old and on_exists == "overwrite":
        kept = []
        for p in old:
            r = _file_rank(p.name)
            if r != rank and lock_held(path, r):
                kept.append(p.name)  # another rank, being written now: not an old dump
            else:
                p.unlink()
        warnings.warn(f"deleted the old dump in {str(path)!r} ({len(old) - len(kept)} rank file(s))"
                      + (f"; kept {', '.join(kept)}, being written by live processes" if kept else ""), stacklevel=2)
    if path != base:
        warnings.warn(f"dump path {str(base)!r} already holds a dump or is in use; writing to {str(path)!r} "
                      "instead", stacklevel=2)
    return path, lock, created


def resolve_dump_dir(path: str | Path, on_exists: str = "new") -> Path:
    """The directory ``claim_dump_dir`` picks for rank 0, created, without keeping the claim.

    Another process may take it before a writer opens it: ``claim_dump_dir`` keeps the claim.
    """
    path, lock, _ = claim_dump_dir(path, on_exists)
    lock.release()
    return path

