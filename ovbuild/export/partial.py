"""The hidden folders an export writes in before its OUT exists, and the removal of those a dead export left.

Each export owns a stem `.<OUT name>.ovbuild-<pid>-<random>` next to OUT: `<stem>.partial` is the folder it
writes into, `<stem>.old` the old OUT for a moment during a replace without renameat2, and `<stem>.lock` a file that
the export holds an flock on from before the folder exists until after it is gone. A SIGKILL (or a power cut)
can still leave the folder behind; the next export into the same parent folder finds the lock free and cleans up.
The lock, not the pid, tells whether the owner is alive: a pid is reused, and means nothing to another pid
namespace (a container sharing the folder) or another host (NFS carries flocks as POSIX locks); the pid is in the
names for people, and in the lock file, written once the lock is held, so that a lock file still empty is known to
be one whose owner is between creating and locking it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import shutil
from pathlib import Path

from ovbuild.export.renames import move_noreplace

log = logging.getLogger(__name__)
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)  # a filesystem without flock (some FUSE mounts)
_LOCK = re.compile(r"^\.(?P<out>.+)\.ovbuild-(?P<pid>\d+)-[0-9a-f]+\.lock$")


class PartialFolder:
    """`<stem>.partial`, created under an flock that a dead owner no longer holds."""

    def __init__(self, out: Path):
        self.out = out
        for _ in range(100):
            stem = out.parent / f".{out.name}.ovbuild-{os.getpid()}-{secrets.token_hex(4)}"
            try:
                self._fd = os.open(f"{stem}.lock", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"{out.parent}: no free name for a partial folder")
        self.lock = Path(f"{stem}.lock")
        self.path = Path(f"{stem}.partial")
        self.aside = Path(f"{stem}.old")
        try:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)  # waits only while a cleaner looks at our still empty lock file
            except OSError as e:
                if e.errno not in _NO_LOCKS:
                    raise
                # No locks on this filesystem: cleaners cannot take ours either, so they never remove our folder.
            os.write(self._fd, f"{os.getpid()}\n".encode())
            self.path.mkdir()
        except BaseException:
            self._unlock()
            raise

    def remove(self) -> None:
        """Delete the folder (and an `aside` left there), then the lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        shutil.rmtree(self.aside, ignore_errors=True)
        self._unlock()

    def _unlock(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.lock.unlink()
        os.close(self._fd)


def remove_stale(parent: Path) -> list[Path]:
    """Clean up after every dead export into `parent`: its partial folder is removed, and an old OUT it had moved
    aside is put back if nothing took its place. Returns the lock files whose owners were found dead."""
    try:
        names = [n for n in os.listdir(parent) if _LOCK.match(n)]
    except OSError:
        return []
    return [parent / n for n in names if _clean_if_dead(parent / n)]


def _clean_if_dead(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # the owner is alive
        # Still the file at that name (not one another cleaner removed meanwhile), and written by its owner.
        if os.fstat(fd).st_ino != _inode(lock) or not os.pread(fd, 64, 0):
            return False
        stem = str(lock)[: -len(".lock")]
        out = lock.parent / _LOCK.match(lock.name)["out"]
        log.info("removing %s.partial, left by an export that did not finish", stem)
        shutil.rmtree(f"{stem}.partial", ignore_errors=True)
        aside = Path(f"{stem}.old")
        if aside.exists():
            try:
                move_noreplace(aside, out)  # killed between the two renames of a replace: the old OUT goes back
            except FileExistsError:
                shutil.rmtree(aside, ignore_errors=True)  # the new OUT made it into place
        lock.unlink()
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None
