"""What an exported folder promises: its file names and each IR's rt_info, as frozen dataclasses.

Builders and the export write rt_info only through `to_rt_info` here, and the runtime and `inspect` read it only
through `from_model`: no rt_info key is spelled anywhere else. Namespaces: `ovbuild/` and `pa/` are ovbuild's own;
`dflash/`, `dflash_mode`, `markov_*` and `hidden_states_decoder_layers` are what OpenVINO GenAI's DFlash pipeline (and
its v2 / Markov-head layout) reads, so their names and values must not change; `runtime_options/` is OpenVINO's.
Values are written as strings (lists comma-joined); a key an older export did not write reads back as None.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import openvino as ov

from ovbuild import __version__
from ovbuild.errors import ExportError
from ovbuild.graph.rt_info import get_rt_info, set_rt_info

MODEL_STEM = "openvino_model"  # the main IR of every folder: a target, or a draft's backbone
MODEL_FILE = f"{MODEL_STEM}.xml"
MARKOV_HEAD_STEM = "openvino_markov_head_model"  # a draft's Markov head, named by its backbone's rt_info
TOKENIZER_IRS = ("openvino_tokenizer.xml", "openvino_detokenizer.xml")
# GenAI finds the target's layer outputs through this top-level key (a JSON string).
LOCATORS_KEY = "hidden_states_decoder_layers"
# DFlash v2 on GPU needs at least this ACTIVATIONS_SCALE_FACTOR (fp16 activations overflow in its convs).
GPU_MIN_ACTIVATIONS_SCALE_FACTOR = 32


class _Reader:
    """Typed rt_info values of one model; errors name the IR file (or the model) and the key."""

    def __init__(self, model: ov.Model, path: str | Path | None):
        self.model = model
        self.where = str(path) if path is not None else f"IR '{model.get_friendly_name()}'"

    def str(self, key: str, required: bool = False) -> str | None:
        value = get_rt_info(self.model, key)
        if value is None and required:
            raise ExportError(f"{self.where}: no rt_info '{key}' (not an ovbuild export, or a damaged one)")
        return value

    def int(self, key: str, required: bool = False) -> int | None:
        value = self.str(key, required)
        if value is None or (value == "" and not required):
            return None
        try:
            return int(value)
        except ValueError:
            raise ExportError(f"{self.where}: rt_info '{key}' = {value!r} is not an integer") from None

    def float(self, key: str, required: bool = False) -> float | None:
        value = self.str(key, required)
        if value is None or (value == "" and not required):
            return None
        try:
            return float(value)
        except ValueError:
            raise ExportError(f"{self.where}: rt_info '{key}' = {value!r} is not a number") from None

    def bool(self, key: str) -> bool | None:
        value = self.str(key)
        if value in (None, ""):
            return None
        if value not in ("True", "False"):
            raise ExportError(f"{self.where}: rt_info '{key}' = {value!r} is not True or False")
        return value == "True"

    def ints(self, key: str, required: bool = False) -> tuple[int, ...] | None:
        """A comma-joined list of integers ("1,3,5"; "" is the empty list)."""
        value = self.str(key, required)
        if value is None:
            return None
        try:
            return tuple(int(v) for v in value.split(",") if v)
        except ValueError:
            raise ExportError(f"{self.where}: rt_info '{key}' = {value!r} is not a list of integers") from None

    def stem(self, key: str) -> str | None:
        """A file stem of the same folder (never a path: a hostile IR must not point outside its folder)."""
        value = self.str(key)
        if value is not None and (not value or "/" in value or "\\" in value or value.startswith(".")):
            raise ExportError(f"{self.where}: rt_info '{key}' = {value!r} is not a file name of the folder")
        return value


def write_rt_info(model: ov.Model, *parts) -> None:
    """Write the rt_info of every part (a dataclass of this module) into `model`."""
    for part in parts:
        set_rt_info(model, part.to_rt_info())


@dataclass(frozen=True)
class Identity:
    """What every ovbuild IR says about itself; None where an older export did not record it."""

    kind: str | None  # "target", "draft" or "markov_head"
    family: str | None  # "qwen3" for targets, the draft family otherwise
    ovbuild_version: str | None = __version__
    openvino_version: str | None = field(default_factory=ov.get_version)

    def to_rt_info(self) -> dict[str, object]:
        return {
            "ovbuild/version": self.ovbuild_version,
            "ovbuild/openvino_version": self.openvino_version,
            "ovbuild/kind": self.kind,
            "ovbuild/family": self.family,
        }

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> Identity:
        r = _Reader(model, path)
        return cls(
            r.str("ovbuild/kind"), r.str("ovbuild/family"), r.str("ovbuild/version"), r.str("ovbuild/openvino_version")
        )


@dataclass(frozen=True)
class HeadGeometry:
    """KV heads and head size of an IR's attention: PagedAttention nodes need them as node rt_info, which the IR
    format drops, so the model keeps them and `ovbuild.graph.ir.read_ir` puts them back."""

    num_kv_heads: int
    head_size: int

    def to_rt_info(self) -> dict[str, object]:
        return {"pa/num_kv_heads": self.num_kv_heads, "pa/head_size": self.head_size}

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None, required: bool = False) -> HeadGeometry | None:
        r = _Reader(model, path)
        heads, size = r.int("pa/num_kv_heads", required), r.int("pa/head_size", required)
        return None if heads is None or size is None else cls(heads, size)


@dataclass(frozen=True)
class WeightStorage:
    """How an IR's matrices are stored, in optimum-cli's terms; the integer details only for int8 / int4."""

    weight_format: str | None
    sym: bool | None = None
    group_size: int | None = None  # -1: per output channel
    all_layers: bool | None = None

    def to_rt_info(self) -> dict[str, object]:
        info: dict[str, object] = {"ovbuild/weight_format": self.weight_format}
        details = {
            "ovbuild/sym": self.sym,
            "ovbuild/group_size": self.group_size,
            "ovbuild/all_layers": self.all_layers,
        }
        return info | {k: v for k, v in details.items() if v is not None}

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> WeightStorage:
        r = _Reader(model, path)
        return cls(
            r.str("ovbuild/weight_format"),
            r.bool("ovbuild/sym"),
            r.int("ovbuild/group_size"),
            r.bool("ovbuild/all_layers"),
        )


@dataclass(frozen=True)
class Provenance:
    """Where the IRs of a folder came from (the export writes it into each of them)."""

    source: str | None  # the checkpoint: a folder or a hub id
    revision: str | None  # the hub commit it was downloaded at, or "local"
    ir_format: str | None  # "paged" or "genai"
    target_source: str | None = None  # a draft: the target checkpoint its embedding / lm_head came from
    target_revision: str | None = None

    def to_rt_info(self) -> dict[str, object]:
        info = {"ovbuild/source": self.source, "ovbuild/revision": self.revision, "ovbuild/ir_format": self.ir_format}
        if self.target_source is not None:
            info |= {"ovbuild/target_source": self.target_source, "ovbuild/target_revision": self.target_revision}
        return info

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> Provenance:
        r = _Reader(model, path)
        return cls(
            r.str("ovbuild/source"),
            r.str("ovbuild/revision"),
            r.str("ovbuild/ir_format"),
            r.str("ovbuild/target_source"),
            r.str("ovbuild/target_revision"),
        )


def _form(r: _Reader) -> str:
    return "genai" if r.str("ovbuild/form") == "genai" else "paged"


@dataclass(frozen=True)
class TargetIR:
    """A target's openvino_model.xml. Paged: `hidden_states` holds the taps of `target_layer_ids`. GenAI (stateful
    SDPA): `hidden_state_locators` tells GenAI which node carries each layer's output, by friendly name."""

    heads: HeadGeometry | None
    vocab_size: int | None
    hidden_size: int | None
    target_layer_ids: tuple[int, ...] = ()
    context_length: int | None = None  # positions it serves (paged); the runtime refuses longer requests
    form: str = "paged"
    hidden_state_locators: dict[int, str] | None = None  # GenAI: layer -> producing node
    family: str | None = "qwen3"

    def to_rt_info(self) -> dict[str, object]:
        info = Identity("target", self.family).to_rt_info() | (self.heads.to_rt_info() if self.heads else {})
        info |= {"ovbuild/vocab_size": self.vocab_size, "ovbuild/hidden_size": self.hidden_size}
        if self.form == "genai":
            return info | {LOCATORS_KEY: locators_json(self.hidden_state_locators or {}), "ovbuild/form": "genai"}
        return info | {
            "ovbuild/target_layer_ids": list(self.target_layer_ids),
            "ovbuild/context_length": self.context_length,
        }

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> TargetIR:
        r = _Reader(model, path)
        locators = r.str(LOCATORS_KEY)
        return cls(
            heads=HeadGeometry.from_model(model, path),
            vocab_size=r.int("ovbuild/vocab_size"),
            hidden_size=r.int("ovbuild/hidden_size"),
            target_layer_ids=r.ints("ovbuild/target_layer_ids") or (),
            context_length=r.int("ovbuild/context_length"),
            form=_form(r),
            hidden_state_locators=None if locators is None else parse_locators(locators, r.where),
            family=r.str("ovbuild/family"),
        )


def locators_json(producers: dict[int, str]) -> str:
    """GenAI's `hidden_states_decoder_layers` JSON: layer id -> producing node (friendly name) and output index."""
    layers = {str(i): {"producer": name, "output_index": 0} for i, name in sorted(producers.items())}
    return json.dumps({"layers": layers}, separators=(",", ":"))


def parse_locators(text: str, where: str) -> dict[int, str]:
    """The layer -> producer map of a `hidden_states_decoder_layers` JSON."""
    try:
        return {int(i): entry["producer"] for i, entry in json.loads(text)["layers"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ExportError(f"{where}: rt_info '{LOCATORS_KEY}' is not GenAI's locator JSON") from None


@dataclass(frozen=True)
class DraftIR:
    """A draft's openvino_model.xml (every DFlash-family backbone, both forms): the DFlash keys GenAI reads plus
    ovbuild's own. `markov_head` names the head IR the backbone needs, by file stem."""

    family: str | None
    heads: HeadGeometry | None
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    candidate_offset: int = 1  # block row of the first candidate (older exports: always 1)
    vocab_size: int | None = None
    hidden_size: int | None = None
    target_hidden_size: int | None = None  # the hidden size of the target whose taps it reads
    form: str = "paged"
    markov_head: str | None = None

    def to_rt_info(self) -> dict[str, object]:
        info = Identity("draft", self.family).to_rt_info() | (self.heads.to_rt_info() if self.heads else {})
        info |= {
            "dflash/block_size": self.block_size,
            "dflash/mask_token_id": self.mask_token_id,
            "dflash/target_layer_ids": list(self.target_layer_ids),
            "dflash/candidate_offset": self.candidate_offset,
            "ovbuild/vocab_size": self.vocab_size,
            "ovbuild/hidden_size": self.hidden_size,
            "ovbuild/target_hidden_size": self.target_hidden_size,
        }
        if self.form == "genai":
            info |= {"dflash_mode": "True", "ovbuild/form": "genai"}
        if self.markov_head is not None:
            info["ovbuild/markov_head"] = self.markov_head
        return info

    def markov_head_file(self, folder: str | Path) -> Path | None:
        """The head IR file this backbone needs in its folder, or None."""
        return Path(folder) / f"{self.markov_head}.xml" if self.markov_head is not None else None

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> DraftIR:
        r = _Reader(model, path)
        offset = r.int("dflash/candidate_offset")
        return cls(
            family=r.str("ovbuild/family"),
            heads=HeadGeometry.from_model(model, path),
            block_size=r.int("dflash/block_size", required=True),
            mask_token_id=r.int("dflash/mask_token_id", required=True),
            target_layer_ids=r.ints("dflash/target_layer_ids", required=True),
            candidate_offset=1 if offset is None else offset,
            vocab_size=r.int("ovbuild/vocab_size"),
            hidden_size=r.int("ovbuild/hidden_size"),
            target_hidden_size=r.int("ovbuild/target_hidden_size"),
            form=_form(r),
            markov_head=r.stem("ovbuild/markov_head"),
        )


@dataclass(frozen=True)
class DFlash2Keys:
    """What a DFlash v2 backbone adds to DraftIR, under GenAI's v2 names (`dflash/version` 2)."""

    top_k: int
    selector_rank: int
    conv_kernel_size: int
    conv_group_size: int
    input_embedding_scale: float
    output_multiplier: float
    final_logit_softcapping: float
    gpu_min_activations_scale_factor: int = GPU_MIN_ACTIVATIONS_SCALE_FACTOR

    def to_rt_info(self) -> dict[str, object]:
        return {
            "dflash/version": 2,
            "dflash/gpu_min_activations_scale_factor": self.gpu_min_activations_scale_factor,
            "dflash/top_k": self.top_k,
            "dflash/selector_rank": self.selector_rank,
            "dflash/conv_kernel_size": self.conv_kernel_size,
            "dflash/conv_group_size": self.conv_group_size,
            "dflash/input_embedding_scale": self.input_embedding_scale,
            "dflash/output_multiplier": self.output_multiplier,
            "dflash/final_logit_softcapping": self.final_logit_softcapping,
        }

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> DFlash2Keys | None:
        """The v2 keys of a backbone, None for a backbone of another version."""
        r = _Reader(model, path)
        if r.int("dflash/version") != 2:
            return None
        return cls(
            top_k=r.int("dflash/top_k", required=True),
            selector_rank=r.int("dflash/selector_rank", required=True),
            conv_kernel_size=r.int("dflash/conv_kernel_size", required=True),
            conv_group_size=r.int("dflash/conv_group_size", required=True),
            input_embedding_scale=r.float("dflash/input_embedding_scale", required=True),
            output_multiplier=r.float("dflash/output_multiplier", required=True),
            final_logit_softcapping=r.float("dflash/final_logit_softcapping", required=True),
            gpu_min_activations_scale_factor=r.int("dflash/gpu_min_activations_scale_factor", required=True),
        )


LAYER_PATTERN_KEY = "ovbuild/layer_pattern"  # a hybrid target's layers, L (linear attention) / F (full), e.g. LLLF


@dataclass(frozen=True)
class HybridKeys:
    """What a hybrid (Qwen3.5-family) target adds to TargetIR: its layer pattern and the linear-attention geometry
    the runtime's state pool is sized from."""

    layer_types: tuple[str, ...]
    layer_pattern: str
    linear_layers: tuple[int, ...]
    conv_dim: int
    conv_kernel: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int

    def to_rt_info(self) -> dict[str, object]:
        return {
            "ovbuild/layer_types": list(self.layer_types),
            LAYER_PATTERN_KEY: self.layer_pattern,
            "ovbuild/linear_attention/layers": list(self.linear_layers),
            "ovbuild/linear_attention/conv_dim": self.conv_dim,
            "ovbuild/linear_attention/conv_kernel": self.conv_kernel,
            "ovbuild/linear_attention/num_v_heads": self.num_v_heads,
            "ovbuild/linear_attention/k_head_dim": self.k_head_dim,
            "ovbuild/linear_attention/v_head_dim": self.v_head_dim,
        }


@dataclass(frozen=True)
class DSparkKeys:
    """What a DSpark / DeepSpec DFlash backbone adds to DraftIR: its Markov head's rank (0: none) and type."""

    markov_rank: int
    markov_head_type: str | None = None

    def to_rt_info(self) -> dict[str, object]:
        info: dict[str, object] = {"markov_rank": self.markov_rank}
        if self.markov_head_type is not None:
            info["markov_head_type"] = self.markov_head_type
        return info

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> DSparkKeys | None:
        """The Markov keys of a backbone, None for a backbone that records no Markov rank."""
        r = _Reader(model, path)
        rank = r.int("markov_rank")
        return None if rank is None else cls(rank, r.str("markov_head_type"))


def gpu_activations_scale_factor(model: ov.Model, path: str | Path | None = None) -> float | None:
    """The ACTIVATIONS_SCALE_FACTOR a GPU must compile `model` with: the model's own (OpenVINO's runtime option)
    raised to the minimum a DFlash v2 backbone records; None when it records no minimum."""
    r = _Reader(model, path)
    minimum = r.float("dflash/gpu_min_activations_scale_factor")
    if minimum is None:
        return None
    return max(r.float("runtime_options/ACTIVATIONS_SCALE_FACTOR") or 0.0, minimum)


@dataclass(frozen=True)
class MarkovHeadIR:
    """A draft's openvino_markov_head_model.xml: the candidate selector of a DFlash v2 draft (`head_type` "dflash2",
    a Top-K lattice) or a DSpark Markov head ("vanilla" / "gated": the exact chain and/or the lattice). Never
    PagedAttention, never integer-compressed."""

    family: str | None
    head_type: str | None  # markov_head_type
    rank: int | None  # markov_rank
    vocab_size: int | None
    hidden_size: int | None
    modes: tuple[str, ...] | None = None  # "chain" and/or "lattice"; None: not recorded (DFlash v2)
    top_k: int | None = None  # candidates per row of the lattice
    block_size: int | None = None  # rows of the chain (DSpark)
    version: int | None = None  # dflash/version (DFlash v2: 2)

    @property
    def forms(self) -> tuple[str, ...]:
        """The forms the head holds; GenAI's v2 layout records none, its head being the lattice alone."""
        return self.modes or ("lattice",)

    def to_rt_info(self) -> dict[str, object]:
        optional = {
            "markov_head_mode": None if self.modes is None else list(self.modes),
            "dflash/top_k": self.top_k,
            "dflash/block_size": self.block_size,
            "dflash/version": self.version,
        }
        return Identity("markov_head", self.family).to_rt_info() | {
            "markov_head_type": self.head_type,
            "markov_rank": self.rank,
            "ovbuild/vocab_size": self.vocab_size,
            "ovbuild/hidden_size": self.hidden_size,
            **{k: v for k, v in optional.items() if v is not None},
        }

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> MarkovHeadIR:
        r = _Reader(model, path)
        modes = r.str("markov_head_mode")
        return cls(
            family=r.str("ovbuild/family"),
            head_type=r.str("markov_head_type"),
            rank=r.int("markov_rank"),
            vocab_size=r.int("ovbuild/vocab_size"),
            hidden_size=r.int("ovbuild/hidden_size"),
            modes=None if modes is None else tuple(modes.split(",")),
            top_k=r.int("dflash/top_k"),
            block_size=r.int("dflash/block_size"),
            version=r.int("dflash/version"),
        )


@dataclass(frozen=True)
class SpecialTokens:
    """The tokenizer IRs' rt_info, which GenAI reads: eos ends generation, pad fills batched prompts."""

    eos_token_id: int
    pad_token_id: int
    bos_token_id: int | None = None
    chat_template: str | None = None

    def write(self, model: ov.Model) -> None:
        """Set as typed top-level values, the way openvino-tokenizers writes them (ovbuild never reads them back)."""
        for key in ("eos_token_id", "pad_token_id", "bos_token_id", "chat_template"):
            value = getattr(self, key)
            if value is not None:
                model.set_rt_info(value, key)
