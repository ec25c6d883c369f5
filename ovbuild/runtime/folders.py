"""What an exported folder says it is, and whether a draft folder belongs with a target folder.

Read from the IR's rt_info, falling back on its input and output shapes and the folder's config.json, so that
exports made before a key existed still get every check their files allow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import openvino as ov

from ovbuild.errors import CompatibilityError, ConfigError, ExportError, OvbuildError
from ovbuild.ir import MODEL_FILE, DraftIR, Identity, TargetIR, read_json
from ovbuild.ir.ports import LOGITS, PAST_LENS, TAPS, TOKEN_TYPE_IDS


@dataclass(frozen=True)
class ExportedModel:
    """The main IR of an exported folder: what it is and the widths a pairing depends on (None = not recorded)."""

    folder: Path
    kind: str | None  # "target" or "draft"
    form: str  # "paged" (what ovbuild runs) or "genai" (stateful SDPA IRs for OpenVINO GenAI)
    vocab_size: int | None
    hidden_size: int | None  # target: its hidden size; draft: the target hidden size its fc takes
    tap_layers: tuple[int, ...]  # target: layers exported as hidden_states; draft: the target layers it reads
    tap_width: int | None  # target: hidden_states output width; draft: hidden_states input width
    context_length: int | None  # target: positions it serves


def exported_model(folder: str | Path, model: ov.Model) -> ExportedModel:
    """Read what `model` (the folder's openvino_model.xml) records about itself."""
    folder, path = Path(folder), Path(folder) / MODEL_FILE
    inputs = {p.get_any_name(): p for p in model.inputs}
    outputs = {p.get_any_name(): p for p in model.outputs}
    kind = Identity.from_model(model, path).kind or ("draft" if TOKEN_TYPE_IDS in inputs else "target")
    ir = DraftIR.from_model(model, path) if kind == "draft" else TargetIR.from_model(model, path)
    return ExportedModel(
        folder=folder,
        kind=kind,
        form="genai" if ir.form == "genai" or PAST_LENS not in inputs else "paged",
        vocab_size=ir.vocab_size or _last_dim(outputs.get(LOGITS)),
        hidden_size=ir.target_hidden_size if isinstance(ir, DraftIR) else ir.hidden_size,
        tap_layers=ir.target_layer_ids,
        tap_width=_last_dim((inputs if kind == "draft" else outputs).get(TAPS)),
        context_length=(None if isinstance(ir, DraftIR) else ir.context_length) or _config_context_length(folder),
    )


def require_target(target: ExportedModel) -> None:
    """Refuse folders `ovbuild generate` cannot run as its target, saying what they are."""
    _require_paged(target)
    if target.kind != "target":
        raise ExportError(
            f"{target.folder}: this is an exported draft, not a target (give it as the draft, and the target's "
            "folder as the target)"
        )


def require_draft(draft: ExportedModel) -> None:
    """Refuse folders that cannot run as a draft, saying what they are."""
    _require_paged(draft)
    if draft.kind != "draft":
        raise ExportError(f"{draft.folder}: this is an exported target, not a draft")


def _require_paged(info: ExportedModel) -> None:
    if info.form == "genai":
        raise ExportError(
            f"{info.folder}: this is a --format genai export, for OpenVINO GenAI; ovbuild runs --format paged "
            "exports (export the checkpoint again without --format genai)"
        )


def check_pair(target: ExportedModel, draft: ExportedModel) -> None:
    """Raise CompatibilityError, naming both folders, unless the draft reads what the target gives."""
    d, t = f"draft {draft.folder}", f"target {target.folder}"
    if None not in (draft.hidden_size, target.hidden_size) and draft.hidden_size != target.hidden_size:
        raise CompatibilityError(
            f"{d} was exported for a target of hidden size {draft.hidden_size} but {t} has hidden size "
            f"{target.hidden_size}"
        )
    if draft.tap_layers != target.tap_layers:
        raise CompatibilityError(
            f"{d} reads target layers {list(draft.tap_layers)} but {t} was exported with taps "
            f"{list(target.tap_layers)} (export the target with --draft-of this draft)"
        )
    if None not in (draft.tap_width, target.tap_width) and draft.tap_width != target.tap_width:
        raise CompatibilityError(f"{d} reads taps {draft.tap_width} wide but {t} gives taps {target.tap_width} wide")
    if None not in (draft.vocab_size, target.vocab_size) and draft.vocab_size != target.vocab_size:
        raise CompatibilityError(f"{d} has a vocabulary of {draft.vocab_size} tokens but {t} has {target.vocab_size}")


def context_length(target: ExportedModel, max_model_len: int | None) -> int | None:
    """Positions a request may use: the target's, or fewer when `max_model_len` lowers it."""
    if max_model_len is None:
        return target.context_length
    if target.context_length is not None and max_model_len > target.context_length:
        raise ConfigError(
            f"max model length {max_model_len} is beyond the {target.context_length} positions target "
            f"{target.folder} serves (max_position_embeddings): it can only be lowered"
        )
    return max_model_len


def _config_context_length(folder: Path) -> int | None:
    """Exports made before rt_info recorded it: the copied config.json's max_position_embeddings, when it holds one
    (a RoPE scaling that stretches it is left out: the bound errs on the short side)."""
    try:
        value = read_json(folder / "config.json").get("max_position_embeddings")
    except OvbuildError:
        return None
    return value if type(value) is int and value > 0 else None


def _last_dim(port: ov.Output | None) -> int | None:
    if port is None:
        return None
    dim = port.get_partial_shape()[-1]
    return dim.get_length() if dim.is_static else None
