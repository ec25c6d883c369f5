"""What an exported folder holds: the IRs with provenance rt_info, the source configs and a target's tokenizer."""

from __future__ import annotations

import importlib
import json
import logging
import shutil
from pathlib import Path

import openvino as ov

from ovbuild import __version__
from ovbuild.errors import ExportError, UnsupportedError
from ovbuild.export.tokenizer import convert_tokenizer, special_tokens
from ovbuild.graph.ir import save_ir
from ovbuild.graph.rt_info import set_rt_info
from ovbuild.graph.weights import WeightPolicy
from ovbuild.weights.checkpoint import Checkpoint

log = logging.getLogger(__name__)
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_IRS = ("openvino_tokenizer.xml", "openvino_detokenizer.xml")


def provenance(
    ckpt: Checkpoint, policy: WeightPolicy, ir_format: str, target: Checkpoint | None = None
) -> dict[str, object]:
    """rt_info saying where an IR came from and how its weights are stored."""
    values: dict[str, object] = {
        "ovbuild/version": __version__,
        "ovbuild/openvino_version": ov.get_version(),
        "ovbuild/source": ckpt.source,
        "ovbuild/revision": resolved_revision(ckpt),
        "ovbuild/ir_format": ir_format,
        "ovbuild/weight_format": policy.weight_format,
    }
    if target is not None:
        values |= {"ovbuild/target_source": target.source, "ovbuild/target_revision": resolved_revision(target)}
    return values


def resolved_revision(ckpt: Checkpoint) -> str:
    """The commit a hub checkpoint was downloaded at (its snapshot folder's name), else the revision asked for."""
    if ckpt.folder.parent.name == "snapshots":
        return ckpt.folder.name
    return ckpt.revision or "local"


class Package:
    """Writes an export's files into the partial folder `tmp`; errors name them as they will be in `out`."""

    def __init__(self, tmp: Path, out: Path):
        self.tmp, self.out = tmp, out

    def save_models(self, models: dict[str, ov.Model], rt_info: dict[str, object]) -> None:
        """Each model as `<stem>.xml/.bin`, with the keys of `rt_info` it does not carry yet."""
        for stem, model in models.items():
            # A builder's own keys win (the weight policy describes its storage best); provenance fills in the rest.
            set_rt_info(model, {k: v for k, v in rt_info.items() if not model.has_rt_info(k.split("/"))})
            name = f"{stem}.xml"
            log.info("writing %s", name)
            try:
                save_ir(model, self.tmp / name)
            except (OSError, RuntimeError) as e:
                raise self.write_error(name, e) from e

    def copy_files(self, source: Path, names: tuple[str, ...]) -> None:
        """Copy whichever of `names` exist in `source`."""
        for name in names:
            if (source / name).is_file():
                try:
                    shutil.copyfile(source / name, self.tmp / name)
                except OSError as e:
                    raise self.write_error(name, e) from e

    def write_generation_config(self, eos_token_ids: tuple[int, ...]) -> None:
        """A generation_config.json with the config's eos ids when the checkpoint has none (runtimes stop on them)."""
        if not (self.tmp / "generation_config.json").exists() and eos_token_ids:
            config = {"eos_token_id": list(eos_token_ids), "do_sample": False}
            (self.tmp / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")

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
            try:
                ov.save_model(model, str(self.tmp / name))
            except (OSError, RuntimeError) as e:
                raise self.write_error(name, e) from e

    def write_error(self, name: str, e: Exception) -> ExportError:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[-1]
        return ExportError(f"{self.out / name}: cannot be written ({reason})")
