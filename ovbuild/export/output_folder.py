"""An export's OUT folder: written as a hidden sibling and moved into place only when complete.

Nothing at OUT is ever lost or clobbered. On failure or interrupt the partial folder (and any parent folder created
for it) is removed and OUT is untouched. Without overwrite, the move into place cannot replace anything: an OUT
that appeared while the export ran (another export, a user's folder) stays, and this export fails. With overwrite,
the new folder and the old OUT swap places in one step, so an interrupt at any moment leaves one of the two at OUT.
The steps that must not be cut in half hold Ctrl-C and SIGTERM back until they are done; after a SIGKILL, the next
export into the same parent folder removes what is left (see partial.py).
"""

from __future__ import annotations

from pathlib import Path

from ovbuild.errors import ExportError
from ovbuild.export.partial import PartialFolder, remove_stale
from ovbuild.export.renames import exchange, move_noreplace
from ovbuild.ir import MODEL_FILE
from ovbuild.signals import signals_deferred


class OutputFolder:
    """`with OutputFolder(out, overwrite) as tmp:` write into tmp; on a clean exit tmp becomes `out`."""

    def __init__(self, out: str | Path, overwrite: bool = False):
        self.out = Path(out).expanduser().absolute()
        self.overwrite = overwrite
        self.partial: PartialFolder | None = None
        self._created: list[Path] = []  # parent folders this export made, removed again on failure
        self._check_out()

    def __enter__(self) -> Path:
        if self.out.parent.is_dir():
            remove_stale(self.out.parent)
        with signals_deferred():
            self._make_parents()
            try:
                self.partial = PartialFolder(self.out)
            except OSError as e:
                self._remove_parents()
                raise ExportError(f"{self.out}: cannot write here ({e.strerror or e})") from e
        return self.partial.path

    def __exit__(self, exc_type, exc, tb) -> None:
        with signals_deferred():
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

    def _occupied(self) -> bool:
        return self.out.exists() or self.out.is_symlink()

    def _check_out(self) -> None:
        if not self._occupied():
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
            except FileExistsError:
                continue  # another export made it meanwhile: theirs to keep
            except OSError as e:
                self._remove_parents()
                raise ExportError(f"{self.out}: cannot create folder {folder} ({e.strerror or e})") from e
            self._created.append(folder)

    def _commit(self) -> None:
        tmp = self.partial.path
        try:
            if self.overwrite and self._occupied():
                self._check_out()  # what is there now may not be what was checked when the export started
                exchange(tmp, self.out, self.partial.aside)  # the old OUT is now at tmp, removed below
            else:
                move_noreplace(tmp, self.out)
        except FileExistsError as e:
            raise ExportError(
                f"{self.out}: already exists (it appeared while this export ran and was left as it is; "
                "pass --overwrite to replace it)"
            ) from e
        except OSError as e:
            raise ExportError(f"{self.out}: cannot move the finished export into place ({e.strerror or e})") from e
        self._created = []
        self._discard()

    def _discard(self) -> None:
        if self.partial is not None:
            self.partial.remove()
            self.partial = None
        self._remove_parents()

    def _remove_parents(self) -> None:
        for folder in reversed(self._created):
            try:
                folder.rmdir()
            except OSError:
                break
        self._created = []
