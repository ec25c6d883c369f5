"""An export's OUT folder: written as a hidden sibling and moved into place only when complete.

On failure the partial folder (and any parent folder created for it) is removed and an existing OUT is untouched;
with overwrite, the old OUT is renamed aside, the new one renamed in, and the old one deleted last, so a failure at
any step leaves either the old or the new folder at OUT.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ovbuild.errors import ExportError
from ovbuild.graph.ir import MODEL_FILE


class OutputFolder:
    """`with OutputFolder(out, overwrite) as tmp:` write into tmp; on a clean exit tmp becomes `out`."""

    def __init__(self, out: str | Path, overwrite: bool = False):
        self.out = Path(out).expanduser().absolute()
        self.overwrite = overwrite
        self.tmp: Path | None = None
        self._created: list[Path] = []  # parent folders this export made, removed again on failure
        self._check_out()

    def __enter__(self) -> Path:
        self._make_parents()
        try:
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=".partial", dir=self.out.parent))
            self.tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it private; OUT gets the usual permissions
        except OSError as e:
            self._remove_parents()
            raise ExportError(f"{self.out}: cannot write here ({e.strerror or e})") from e
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self._commit()
                return
            except BaseException:
                self._discard()
                raise
        self._discard()

    def refuse_overlap(self, source: Path, what: str) -> None:
        """A checkpoint folder at or inside OUT would be deleted when OUT is replaced: refuse that."""
        source = source.resolve()
        out = self.out.resolve()
        if source == out or out in source.parents:
            raise ExportError(f"{self.out}: would replace the {what} it is exported from ({source})")

    def _check_out(self) -> None:
        if not self.out.exists() and not self.out.is_symlink():
            return
        if not self.overwrite:
            raise ExportError(f"{self.out}: already exists (pass --overwrite to replace it)")
        if not self.out.is_dir() or self.out.is_symlink():
            raise ExportError(f"{self.out}: exists and is not a folder; refusing to replace it")
        if any(self.out.iterdir()) and not (self.out / MODEL_FILE).exists():
            raise ExportError(f"{self.out}: is not an exported folder (no {MODEL_FILE}); refusing to replace it")

    def _make_parents(self) -> None:
        missing = [p for p in [self.out.parent, *self.out.parent.parents] if not p.exists()]
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except OSError as e:
                self._remove_parents()
                raise ExportError(f"{self.out}: cannot create folder {folder} ({e.strerror or e})") from e
            self._created.append(folder)

    def _commit(self) -> None:
        old = None
        try:
            if self.out.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=".old", dir=self.out.parent))
                old.rmdir()  # only the unique name is wanted: rename needs the destination absent
                os.rename(self.out, old)
            os.rename(self.tmp, self.out)
        except OSError as e:
            if old is not None and old.exists() and not self.out.exists():
                os.rename(old, self.out)
            raise ExportError(f"{self.out}: cannot move the finished export into place ({e.strerror or e})") from e
        self.tmp = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _discard(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        self._remove_parents()

    def _remove_parents(self) -> None:
        for folder in reversed(self._created):
            try:
                folder.rmdir()
            except OSError:
                break
        self._created = []


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
