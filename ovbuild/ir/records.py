"""What each IR of an exported folder records about itself (its rt_info), as frozen dataclasses.

Builders and the export write rt_info only through these records (`write_rt_info`), and the runtime and `inspect`
read it only through `from_model`: every key is spelled once, in the table below, and every record names its fields'
keys from it (`ovbuild.ir.codec` writes and reads them). Namespaces: `ovbuild/` and `pa/` are ovbuild's own; `dflash/`,
`dflash_mode`, `markov_*` and `hidden_states_decoder_layers` are what OpenVINO GenAI's DFlash pipeline (and its v2 /
Markov-head layout) reads, so their names and values must not change; `runtime_options/` is OpenVINO's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import openvino as ov

from ovbuild.errors import RequestError
from ovbuild.ir.codec import BOOL, FLOAT, INT, INTS, LOCATORS, SET, STEM, STRS, Key, Record, Where, part, rt
from ovbuild.ir.ports import GRID_THW, MINICPM_PIXEL_VALUES, MINICPM_TARGET_SIZES, PIXEL_VALUES
from ovbuild.version import __version__

# Every rt_info key an ovbuild IR carries, once.
VERSION = Key("ovbuild/version")
OPENVINO_VERSION = Key("ovbuild/openvino_version")
KIND = Key("ovbuild/kind")  # "target", "draft", "markov_head" or "vision"
FAMILY = Key("ovbuild/family")
NUM_KV_HEADS = Key("pa/num_kv_heads", INT)
HEAD_SIZE = Key("pa/head_size", INT)
WEIGHT_FORMAT = Key("ovbuild/weight_format")
SYM = Key("ovbuild/sym", BOOL)
GROUP_SIZE = Key("ovbuild/group_size", INT)
ALL_LAYERS = Key("ovbuild/all_layers", BOOL)
SOURCE = Key("ovbuild/source")
REVISION = Key("ovbuild/revision")
# "paged" or "genai": builders write it on GenAI IRs, the export on every IR (exports before it was the builders' to
# write also recorded GenAI IRs under "ovbuild/form", which reads the same)
IR_FORMAT = Key("ovbuild/ir_format", formerly=("ovbuild/form",))
TARGET_SOURCE = Key("ovbuild/target_source")
TARGET_REVISION = Key("ovbuild/target_revision")
VOCAB_SIZE = Key("ovbuild/vocab_size", INT)
HIDDEN_SIZE = Key("ovbuild/hidden_size", INT)
TARGET_HIDDEN_SIZE = Key("ovbuild/target_hidden_size", INT)
TARGET_LAYER_IDS = Key("ovbuild/target_layer_ids", INTS)
CONTEXT_LENGTH = Key("ovbuild/context_length", INT)
LOCATORS_KEY = Key("hidden_states_decoder_layers", LOCATORS)  # GenAI finds the taps through it (a JSON string)
MARKOV_HEAD = Key("ovbuild/markov_head", STEM)
DFLASH_MODE = Key("dflash_mode")
BLOCK_SIZE = Key("dflash/block_size", INT)
MASK_TOKEN_ID = Key("dflash/mask_token_id", INT)
DRAFT_LAYER_IDS = Key("dflash/target_layer_ids", INTS)
CANDIDATE_OFFSET = Key("dflash/candidate_offset", INT)
DFLASH_VERSION = Key("dflash/version", INT)
GPU_MIN_SCALE = Key("dflash/gpu_min_activations_scale_factor", INT)
GPU_MIN_SCALE_VALUE = Key(GPU_MIN_SCALE.path, FLOAT)  # the same key, read as a number for the GPU's option
TOP_K = Key("dflash/top_k", INT)
SELECTOR_RANK = Key("dflash/selector_rank", INT)
CONV_KERNEL_SIZE = Key("dflash/conv_kernel_size", INT)
CONV_GROUP_SIZE = Key("dflash/conv_group_size", INT)
INPUT_EMBEDDING_SCALE = Key("dflash/input_embedding_scale", FLOAT)
OUTPUT_MULTIPLIER = Key("dflash/output_multiplier", FLOAT)
FINAL_LOGIT_SOFTCAPPING = Key("dflash/final_logit_softcapping", FLOAT)
LAYER_TYPES = Key("ovbuild/layer_types", STRS)
LAYER_PATTERN = Key("ovbuild/layer_pattern")  # a hybrid target's layers, L (linear attention) / F (full), e.g. LLLF
LINEAR_LAYERS = Key("ovbuild/linear_attention/layers", INTS)
CONV_DIM = Key("ovbuild/linear_attention/conv_dim", INT)
CONV_KERNEL = Key("ovbuild/linear_attention/conv_kernel", INT)
NUM_V_HEADS = Key("ovbuild/linear_attention/num_v_heads", INT)
K_HEAD_DIM = Key("ovbuild/linear_attention/k_head_dim", INT)
V_HEAD_DIM = Key("ovbuild/linear_attention/v_head_dim", INT)
MROPE_SECTION = Key("ovbuild/images/mrope_section", INTS)  # a target that takes image embeddings
MROPE_INTERLEAVED = Key("ovbuild/images/mrope_interleaved", BOOL)
VISION_DEPTH = Key("ovbuild/vision/depth", INT)
VISION_NUM_HEADS = Key("ovbuild/vision/num_heads", INT)
VISION_IN_CHANNELS = Key("ovbuild/vision/in_channels", INT)
VISION_PATCH_SIZE = Key("ovbuild/vision/patch_size", INT)
VISION_TEMPORAL_PATCH_SIZE = Key("ovbuild/vision/temporal_patch_size", INT)
VISION_POSITION_GRID = Key("ovbuild/vision/num_position_embeddings", INT)
VISION_OUT_HIDDEN_SIZE = Key("ovbuild/vision/out_hidden_size", INT)
VISION_PATCHES_PER_TOKEN = Key("ovbuild/vision/patches_per_token", INT)
VISION_GRID_MULTIPLE = Key("ovbuild/vision/grid_multiple", INT)
VISION_DOWNSAMPLE_MODE = Key("ovbuild/vision/downsample_mode")
MARKOV_RANK = Key("markov_rank", INT)
MARKOV_HEAD_TYPE = Key("markov_head_type")
MARKOV_HEAD_MODE = Key("markov_head_mode", STRS)
ACTIVATIONS_SCALE_FACTOR = Key("runtime_options/ACTIVATIONS_SCALE_FACTOR", FLOAT)  # OpenVINO's own option

# DFlash v2 on GPU needs at least this ACTIVATIONS_SCALE_FACTOR (fp16 activations overflow in its convs).
GPU_MIN_ACTIVATIONS_SCALE_FACTOR = 32


def _identity(kind: str) -> tuple:
    """The FIXED keys every IR of `kind` writes: what it is, and which ovbuild and OpenVINO made it."""
    return ((KIND, kind, None), (VERSION, __version__, None), (OPENVINO_VERSION, lambda r: ov.get_version(), None))


def _genai(record) -> bool:
    return record.form == "genai"


def _paged(record) -> bool:
    return record.form != "genai"


@dataclass(frozen=True)
class Identity(Record):
    """What every ovbuild IR says about itself; None where an older export did not record it."""

    kind: str | None = rt(KIND)
    family: str | None = rt(FAMILY)  # "qwen3" / "qwen3_5" for targets, the draft family otherwise
    ovbuild_version: str | None = rt(VERSION, __version__)
    openvino_version: str | None = rt(OPENVINO_VERSION, default_factory=ov.get_version)


@dataclass(frozen=True)
class HeadGeometry(Record):
    """KV heads and head size of an IR's attention: PagedAttention nodes need them as node rt_info, which the IR
    format drops, so the model keeps them and `ovbuild.ir.files.read_ir` puts them back."""

    num_kv_heads: int = rt(NUM_KV_HEADS)
    head_size: int = rt(HEAD_SIZE)

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None, required: bool = False) -> HeadGeometry | None:
        where = Where(model, path)
        heads, size = NUM_KV_HEADS.read(model, where, required), HEAD_SIZE.read(model, where, required)
        return None if heads is None or size is None else cls(heads, size)


@dataclass(frozen=True)
class WeightStorage(Record):
    """How an IR's matrices are stored, in optimum-cli's terms; the integer details only for int8 / int4."""

    weight_format: str | None = rt(WEIGHT_FORMAT)
    sym: bool | None = rt(SYM, None, when=SET)
    group_size: int | None = rt(GROUP_SIZE, None, when=SET)  # -1: per output channel
    all_layers: bool | None = rt(ALL_LAYERS, None, when=SET)


def _has_target(record) -> bool:
    return record.target_source is not None


@dataclass(frozen=True)
class Provenance(Record):
    """Where the IRs of a folder came from (the export writes it into each of them)."""

    source: str | None = rt(SOURCE)  # the checkpoint: a folder or a hub id
    revision: str | None = rt(REVISION)  # the hub commit it was downloaded at, or "local"
    ir_format: str | None = rt(IR_FORMAT)  # "paged" or "genai"
    target_source: str | None = rt(TARGET_SOURCE, None, when=_has_target)  # a draft: where its embedding came from
    target_revision: str | None = rt(TARGET_REVISION, None, when=_has_target)


@dataclass(frozen=True)
class TargetIR(Record):
    """A target's openvino_model.xml. Paged: `hidden_states` holds the taps of `target_layer_ids`. GenAI (stateful
    SDPA): `hidden_state_locators` tells GenAI which node carries each layer's output, by friendly name."""

    FIXED = _identity("target")

    heads: HeadGeometry | None = part(HeadGeometry)  # noqa: RUF009 (a field declaration)
    vocab_size: int | None = rt(VOCAB_SIZE)
    hidden_size: int | None = rt(HIDDEN_SIZE)
    target_layer_ids: tuple[int, ...] = rt(TARGET_LAYER_IDS, (), when=_paged, absent=())
    context_length: int | None = rt(CONTEXT_LENGTH, None, when=_paged)  # positions it serves (paged)
    form: str = rt(IR_FORMAT, "paged", when=_genai, absent="paged")
    # GenAI: layer -> producing node
    hidden_state_locators: dict[int, str] | None = rt(LOCATORS_KEY, None, when=_genai)  # noqa: RUF009
    family: str | None = rt(FAMILY, "qwen3")


@dataclass(frozen=True)
class DraftIR(Record):
    """A draft's openvino_model.xml (every DFlash-family backbone, both forms): the DFlash keys GenAI reads plus
    ovbuild's own. `markov_head` names the head IR the backbone needs, by file stem."""

    FIXED = (*_identity("draft"), (DFLASH_MODE, "True", _genai))

    family: str | None = rt(FAMILY)
    heads: HeadGeometry | None = part(HeadGeometry)  # noqa: RUF009 (a field declaration)
    block_size: int = rt(BLOCK_SIZE, required=True)
    mask_token_id: int = rt(MASK_TOKEN_ID, required=True)
    target_layer_ids: tuple[int, ...] = rt(DRAFT_LAYER_IDS, required=True)
    candidate_offset: int = rt(CANDIDATE_OFFSET, 1, absent=1)  # block row of the first candidate (older: always 1)
    vocab_size: int | None = rt(VOCAB_SIZE, None)
    hidden_size: int | None = rt(HIDDEN_SIZE, None)
    target_hidden_size: int | None = rt(TARGET_HIDDEN_SIZE, None)  # the hidden size of the target it reads
    form: str = rt(IR_FORMAT, "paged", when=_genai, absent="paged")
    markov_head: str | None = rt(MARKOV_HEAD, None, when=SET)

    def markov_head_file(self, folder: str | Path) -> Path | None:
        """The head IR file this backbone needs in its folder, or None."""
        return Path(folder) / f"{self.markov_head}.xml" if self.markov_head is not None else None


@dataclass(frozen=True)
class DFlash2Keys(Record):
    """What a DFlash v2 backbone adds to DraftIR, under GenAI's v2 names (`dflash/version` 2)."""

    FIXED = ((DFLASH_VERSION, 2, None),)

    top_k: int = rt(TOP_K, required=True)
    selector_rank: int = rt(SELECTOR_RANK, required=True)
    conv_kernel_size: int = rt(CONV_KERNEL_SIZE, required=True)
    conv_group_size: int = rt(CONV_GROUP_SIZE, required=True)
    input_embedding_scale: float = rt(INPUT_EMBEDDING_SCALE, required=True)
    output_multiplier: float = rt(OUTPUT_MULTIPLIER, required=True)
    final_logit_softcapping: float = rt(FINAL_LOGIT_SOFTCAPPING, required=True)
    gpu_min_activations_scale_factor: int = rt(GPU_MIN_SCALE, GPU_MIN_ACTIVATIONS_SCALE_FACTOR, required=True)

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> DFlash2Keys | None:
        """The v2 keys of a backbone, None for a backbone of another version."""
        if DFLASH_VERSION.read(model, Where(model, path)) != 2:
            return None
        return super().from_model(model, path)


@dataclass(frozen=True)
class HybridKeys(Record):
    """What a hybrid (Qwen3.5-family) target adds to TargetIR: its layer pattern and the linear-attention geometry
    the runtime's state pool is sized from."""

    layer_types: tuple[str, ...] = rt(LAYER_TYPES)
    layer_pattern: str = rt(LAYER_PATTERN)
    linear_layers: tuple[int, ...] = rt(LINEAR_LAYERS)
    conv_dim: int = rt(CONV_DIM)
    conv_kernel: int = rt(CONV_KERNEL)
    num_v_heads: int = rt(NUM_V_HEADS)
    k_head_dim: int = rt(K_HEAD_DIM)
    v_head_dim: int = rt(V_HEAD_DIM)

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> HybridKeys | None:
        """The hybrid keys of a target, None for a target without linear-attention layers."""
        if LAYER_PATTERN.read(model, Where(model, path)) is None:
            return None
        return super().from_model(model, path)


@dataclass(frozen=True)
class ImageKeys(Record):
    """What a target that takes images adds (its mrope_offsets, image_embeds and image_rows inputs): the multi-axis
    RoPE those positions turn by."""

    mrope_section: tuple[int, ...] = rt(MROPE_SECTION)
    mrope_interleaved: bool = rt(MROPE_INTERLEAVED)

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> ImageKeys | None:
        """The image keys of a target, None for a target that takes text only."""
        if MROPE_SECTION.read(model, Where(model, path)) is None:
            return None
        return super().from_model(model, path)


@dataclass(frozen=True)
class DSparkKeys(Record):
    """What a DSpark / DeepSpec DFlash backbone adds to DraftIR: its Markov head's rank (0: none) and type."""

    markov_rank: int = rt(MARKOV_RANK)
    markov_head_type: str | None = rt(MARKOV_HEAD_TYPE, None, when=SET)

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> DSparkKeys | None:
        """The Markov keys of a backbone, None for a backbone that records no Markov rank."""
        keys = super().from_model(model, path)
        return None if keys.markov_rank is None else keys


def gpu_activations_scale_factor(model: ov.Model, path: str | Path | None = None) -> float | None:
    """The ACTIVATIONS_SCALE_FACTOR a GPU must compile `model` with: the model's own (OpenVINO's runtime option)
    raised to the minimum a DFlash v2 backbone records; None when it records no minimum."""
    where = Where(model, path)
    minimum = GPU_MIN_SCALE_VALUE.read(model, where)
    if minimum is None:
        return None
    return max(ACTIVATIONS_SCALE_FACTOR.read(model, where) or 0.0, minimum)


@dataclass(frozen=True)
class MarkovHeadIR(Record):
    """A draft's openvino_markov_head_model.xml: the candidate selector of a DFlash v2 draft (`head_type` "dflash2",
    a Top-K lattice) or a DSpark Markov head ("vanilla" / "gated": the exact chain and/or the lattice). Never
    PagedAttention, never integer-compressed."""

    FIXED = _identity("markov_head")

    family: str | None = rt(FAMILY)
    head_type: str | None = rt(MARKOV_HEAD_TYPE)
    rank: int | None = rt(MARKOV_RANK)
    vocab_size: int | None = rt(VOCAB_SIZE)
    hidden_size: int | None = rt(HIDDEN_SIZE)
    modes: tuple[str, ...] | None = rt(MARKOV_HEAD_MODE, None, when=SET)  # "chain" and/or "lattice"; None: DFlash v2
    top_k: int | None = rt(TOP_K, None, when=SET)  # candidates per row of the lattice
    block_size: int | None = rt(BLOCK_SIZE, None, when=SET)  # rows of the chain (DSpark)
    version: int | None = rt(DFLASH_VERSION, None, when=SET)  # dflash/version (DFlash v2: 2)

    @property
    def forms(self) -> tuple[str, ...]:
        """The forms the head holds; GenAI's v2 layout records none, its head being the lattice alone."""
        return self.modes or ("lattice",)


@dataclass(frozen=True)
class VisionIR(Record):
    """A vision-language target's openvino_vision_model.xml: the tower's geometry, which the image processor sizes
    images by (patches of patch_size pixels, every grid side a multiple of `grid_multiple` patches) and the runtime
    counts placeholder tokens by (one per `patches_per_token` patches, out_hidden_size wide). Both towers write the
    common fields; the Qwen3.5 family's adds `temporal_patch_size` (its pixels are [patches, C*T*P*P] with grids
    (t, h, w)), MiniCPM-V's `downsample_mode` (pixels [1, C, P, patches*P], grids (h, w) per crop)."""

    FIXED = _identity("vision")

    family: str | None = rt(FAMILY)  # the VisionTower's name: "qwen3_5_vision", "minicpmv4_7_vision"
    depth: int = rt(VISION_DEPTH)
    hidden_size: int = rt(HIDDEN_SIZE)  # the tower's width
    num_heads: int = rt(VISION_NUM_HEADS)
    in_channels: int = rt(VISION_IN_CHANNELS)
    patch_size: int = rt(VISION_PATCH_SIZE)
    num_position_embeddings: int = rt(VISION_POSITION_GRID)  # a square table of learned positions
    out_hidden_size: int = rt(VISION_OUT_HIDDEN_SIZE)  # the language model's hidden size
    patches_per_token: int = rt(VISION_PATCHES_PER_TOKEN)
    grid_multiple: int = rt(VISION_GRID_MULTIPLE)
    temporal_patch_size: int | None = rt(VISION_TEMPORAL_PATCH_SIZE, None, when=SET)  # Qwen3.5 family
    downsample_mode: str | None = rt(VISION_DOWNSAMPLE_MODE, None, when=SET)  # MiniCPM-V: "16x" or "4x"

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None) -> VisionIR | None:
        """The vision record of an IR, None for an IR that is not a vision tower."""
        if KIND.read(model, Where(model, path)) != "vision":
            return None
        return super().from_model(model, path)

    @property
    def inputs(self) -> tuple[str, str]:
        """The IR's (pixels, grids) input names."""
        if self.temporal_patch_size is not None:  # the Qwen3.5 family's layout
            return PIXEL_VALUES, GRID_THW
        return MINICPM_PIXEL_VALUES, MINICPM_TARGET_SIZES

    def check_inputs(self, pixel_shape: tuple[int, ...], grid: Sequence[Sequence[int]]) -> int:
        """The tokens the call gives; a RequestError naming the input for one this IR cannot encode: every grid
        side a positive multiple of grid_multiple, and pixels shaped as the grids say (Qwen3.5 family
        [sum t*h*w, C*T*P*P] with grids (t, h, w); MiniCPM-V [1, C, P, sum h*w * P] with grids (h, w))."""
        pixels, grids = self.inputs
        frames = self.temporal_patch_size is not None
        rows = [tuple(int(v) for v in row) for row in grid]
        if not rows:
            raise RequestError(f"{grids}: no image to encode", grids)
        if any(len(row) != (3 if frames else 2) for row in rows):
            raise RequestError(f"{grids}: {rows} is not a list of {'(t, h, w)' if frames else '(h, w)'} rows", grids)
        g = self.grid_multiple
        bad = [row for row in rows if min(row) < 1 or row[-2] % g or row[-1] % g]
        if bad:
            raise RequestError(f"{grids}: patch grids {bad} are not positive multiples of {g}", grids)
        patches = sum(math.prod(row) for row in rows)
        c, p = self.in_channels, self.patch_size
        expected = (patches, c * self.temporal_patch_size * p * p) if frames else (1, c, p, patches * p)
        if tuple(pixel_shape) != expected:
            raise RequestError(
                f"{pixels}: shape {list(pixel_shape)}, expected {list(expected)} for {patches} patches of {p} x {p}",
                pixels,
            )
        return patches // self.patches_per_token


@dataclass(frozen=True)
class SpecialTokens:
    """The tokenizer IRs' rt_info, which GenAI reads: eos ends generation, pad fills batched prompts. Written as
    typed top-level values named as the fields, the way openvino-tokenizers writes them (ovbuild never reads them)."""

    eos_token_id: int
    pad_token_id: int
    bos_token_id: int | None = None
    chat_template: str | None = field(default=None)

    def write(self, model: ov.Model) -> None:
        """Set every value that is not None on `model`."""
        for name, value in vars(self).items():
            if value is not None:
                model.set_rt_info(value, name)
