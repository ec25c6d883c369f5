"""Moving a finished folder to its final name without ever replacing what another process put there.

Linux has both moves an export needs as single atomic system calls (renameat2, called through ctypes):
RENAME_NOREPLACE fails if the destination exists, and RENAME_EXCHANGE swaps two paths, so a replaced folder is
never missing for an instant. Where renameat2 is missing (other systems, old kernels, filesystems such as NFS that
refuse the flags), the fallbacks below keep the promises that matter: `move_noreplace` still never replaces anything,
and `exchange` leaves the old folder under `aside` for the (short) moment between its two renames.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from pathlib import Path

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_UNSUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)


def _load_renameat2():
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError, TypeError):
        return None


_renameat2 = _load_renameat2()


def renameat2(src: Path, dst: Path, flags: int) -> bool:
    """rename(2) with `flags`; False when this system or filesystem does not offer them (nothing was done)."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(src), None, str(dst))


def move_noreplace(src: Path, dst: Path) -> None:
    """Rename folder `src` to `dst`; FileExistsError if anything is at `dst`, which is left as it is.

    Fallback: mkdir(dst) claims the name atomically (it fails if anything is there), and a rename onto an empty
    folder replaces it. Whoever beats us to `dst` either makes our mkdir fail, or puts files into our empty
    placeholder, which makes the rename fail (ENOTEMPTY): either way their folder stays.
    """
    if renameat2(src, dst, _RENAME_NOREPLACE):
        return
    os.mkdir(dst)
    try:
        os.rename(src, dst)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.rmdir(dst)  # our placeholder, unless someone filled it: then rmdir fails and it stays theirs
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst)) from e
        raise


def exchange(new: Path, dst: Path, aside: Path) -> None:
    """Put folder `new` at `dst`, whose old content ends up at `new`'s path (to be deleted by the caller).

    Fallback: `dst` is renamed to `aside`, `new` to `dst`, and `aside` to `new`; if the second rename fails the
    old folder is put back. Only a SIGKILL between the first two renames leaves `dst` missing, with the old folder
    at `aside` for whoever cleans up after a dead export to put back (see partial.py).
    """
    if renameat2(new, dst, _RENAME_EXCHANGE):
        return
    os.rename(dst, aside)
    try:
        os.rename(new, dst)
    except OSError:
        os.rename(aside, dst)
        raise
    os.rename(aside, new)
