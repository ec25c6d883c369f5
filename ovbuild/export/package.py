"""What an exported folder holds: the IRs with provenance rt_info, the source configs and a target's tokenizer."""

from __future__ import annotations

import errno
import importlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openvino as ov

from ovbuild.errors import ExportError, UnsupportedError
from ovbuild.export.tokenizer import convert_tokenizer, special_tokens
from ovbuild.ir import TOKENIZER_IRS, Provenance, save_ir, write_rt_info
from ovbuild.weights.checkpoint import Checkpoint

log = logging.getLogger(__name__)
CONFIG_FILES = ("config.json", "generation_config.json")
# A vision-language target's image processor settings, which the runtime's image prompts are processed by.
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
FREE_MARGIN = 1 << 20  # bytes: a write that fails with less than this left beyond the file's size ran out of space


def provenance(ckpt: Checkpoint, ir_format: str, target: Checkpoint | None = None) -> Provenance:
    """Where an IR came from (its builder records what it is and how its weights are stored)."""
    if target is None:
        return Provenance(ckpt.source, resolved_revision(ckpt), ir_format)
    return Provenance(ckpt.source, resolved_revision(ckpt), ir_format, target.source, resolved_revision(target))


def resolved_revision(ckpt: Checkpoint) -> str:
    """The commit a hub checkpoint was downloaded at (its snapshot folder's name), else the revision asked for."""
    if ckpt.folder.parent.name == "snapshots":
        return ckpt.folder.name
    return ckpt.revision or "local"


class Package:
    """Writes an export's files into the partial folder `tmp`; errors name them as they will be in `out`."""

    def __init__(self, tmp: Path, out: Path):
        self.tmp, self.out = tmp, out

    def save_models(self, models: dict[str, ov.Model], origin: Provenance) -> None:
        """Each model as `<stem>.xml/.bin`, with where it came from in its rt_info."""
        for stem, model in models.items():
            write_rt_info(model, origin)
            name = f"{stem}.xml"
            log.info("writing %s", name)
            with self.writing(name, weight_bytes(model)):
                save_ir(model, self.tmp / name)

    def copy_files(self, ckpt: Checkpoint, names: tuple[str, ...]) -> None:
        """Copy whichever of `names` the checkpoint has (symlinks leading outside it are refused, not followed)."""
        for name in names:
            source = ckpt.own_file(name)
            if source is not None:
                with self.writing(name, source.stat().st_size):
                    shutil.copyfile(source, self.tmp / name)

    def write_generation_config(self, eos_token_ids: tuple[int, ...]) -> None:
        """A generation_config.json with the config's eos ids when the checkpoint has none (runtimes stop on them)."""
        if not (self.tmp / "generation_config.json").exists() and eos_token_ids:
            text = json.dumps({"eos_token_id": list(eos_token_ids), "do_sample": False}, indent=2) + "\n"
            with self.writing("generation_config.json", len(text)):
                (self.tmp / "generation_config.json").write_text(text)

    def convert_tokenizer(self, source: Path, required: bool) -> None:
        """openvino_tokenizer.xml / openvino_detokenizer.xml from `source`'s tokenizer.json, with openvino-tokenizers
        (and without transformers). Optional unless `required` (GenAI opens a target folder through them)."""
        try:
            importlib.import_module("openvino_tokenizers")
        except ImportError as e:
            if required:
                raise ExportError(
                    f"{self.out}: this IR format needs {' / '.join(TOKENIZER_IRS)}, which need "
                    "openvino-tokenizers (pip install 'openvino-tokenizers==2026.4.*')"
                ) from e
            log.info("openvino-tokenizers not installed: no %s written", " / ".join(TOKENIZER_IRS))
            return
        generation_file = self.tmp / "generation_config.json"
        generation = json.loads(generation_file.read_text()) if generation_file.exists() else {}
        try:
            models = convert_tokenizer(source / "tokenizer.json", special_tokens(source, generation))
        except (UnsupportedError, ExportError) as e:
            if required:
                raise
            log.warning("tokenizer not converted to OpenVINO (%s): no %s written", e, " / ".join(TOKENIZER_IRS))
            return
        for name, model in zip(TOKENIZER_IRS, models, strict=True):
            with self.writing(name, weight_bytes(model)):
                ov.save_model(model, str(self.tmp / name))

    @contextmanager
    def writing(self, name: str, size: int) -> Iterator[None]:
        """Turn a failure to write file `name` (about `size` bytes) into an ExportError naming it and the cause."""
        try:
            yield
        except (OSError, RuntimeError) as e:
            raise ExportError(f"{self.out / name}: cannot be written ({self.write_failure(e, size)})") from e

    def write_failure(self, e: OSError | RuntimeError, size: int) -> str:
        """Why a write failed. OpenVINO reports a full disk as `basic_ios::clear: iostream error`, without errno,
        and may delete what it wrote: the free space left, less than the file needs, tells a full disk apart."""
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return os.strerror(e.errno)
        if isinstance(e, RuntimeError):
            try:
                if shutil.disk_usage(self.tmp).free < size + FREE_MARGIN:
                    return os.strerror(errno.ENOSPC)
            except OSError:
                pass
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
        return (str(e).strip().splitlines() or [type(e).__name__])[-1]


def weight_bytes(model: ov.Model) -> int:
    """The size of a model's constants: about the size of its .bin."""
    return sum(op.get_byte_size() for op in model.get_ops() if op.get_type_name() == "Constant")
