"""The ports of ovbuild's IRs, each declared once: its name, element type, rank and role.

A port is its name (a `str`), so the runtime feeds and reads by it as by the string; the graph builders create
inputs from these declarations (`ovbuild.graph.ops.parameter`), and the runtime pads, cuts and binds by role:
ROW inputs get one entry per packed row (padding rows take `fill`; position_ids count from 0), INDEX inputs name the
rows whose outputs a call returns, ROW_OUTPUT outputs have one row per packed row (all other outputs follow the
INDEX input). A port whose name ends in "." is one per layer (`key_cache.3`): `port.of(3)`.
No port name is spelled anywhere else in the package (tests/test_ir_ports.py checks).
"""

from __future__ import annotations

from enum import Enum

import openvino as ov


class Role(Enum):
    ROW = "one entry per packed row"
    INDEX = "names rows whose outputs the call returns"
    STATE_INDEX = "names rows whose linear-attention states the call returns"
    LAYOUT = "the paged layout of the call's sequences"
    CACHE = "a layer's paged KV cache"
    STATE = "a layer's linear-attention state per sequence, before the call"
    STATE_OUTPUT = "a layer's linear-attention state after each row named by STATE_INDEX"
    ROW_OUTPUT = "one row per packed row"
    OUTPUT = "one row per row the INDEX input names"
    HEAD_INPUT = "an input of a draft's Markov head, from its backbone's outputs"
    GENAI = "an input of a GenAI (stateful SDPA) IR"
    IMAGE = "image embeddings and the packed rows they replace (not padded: they name real rows)"
    VISION = "an input or output of a vision tower's IR (one call encodes every image packed into it)"


class Port(str):
    """One port: the name is the string itself; dtype, rank and role describe it, and `fill` is what a ROW input's
    padding rows get (COUNT: 0, 1, 2, ...)."""

    dtype: ov.Type
    rank: int
    role: Role
    fill: int | str

    def __new__(cls, name: str, dtype: ov.Type, rank: int, role: Role, fill: int | str = 0) -> Port:
        port = super().__new__(cls, name)
        port.dtype, port.rank, port.role, port.fill = dtype, rank, role, fill
        return port

    @property
    def per_layer(self) -> bool:
        return self.endswith(".")

    def of(self, layer: int) -> str:
        """The name of a per-layer port for `layer`."""
        return f"{self}{layer}"

    def matches(self, name: str) -> bool:
        """Whether `name` is this port (or, per layer, one of its layers')."""
        return name.startswith(self) if self.per_layer else name == self


i64, i32, f32 = ov.Type.i64, ov.Type.i32, ov.Type.f32
COUNT = "count"  # the fill of a ROW input whose padding rows count from 0

# Paged IRs (what ovbuild runs): per-row inputs.
INPUT_IDS = Port("input_ids", i64, 1, Role.ROW)
TOKEN_TYPE_IDS = Port("token_type_ids", i32, 1, Role.ROW)  # a draft's rows: 0 context, 1 block
POSITION_IDS = Port("position_ids", i64, 1, Role.ROW, COUNT)  # padding rows are a sequence of their own
TAPS_IN = Port("hidden_states", f32, 2, Role.ROW)  # a draft's input: the target's taps of each context row
# A vision-language target's rows: each row's temporal, height and width position minus its position_ids (0 for text
# before any image; the request's rope delta after one), and the image embeddings written over the rows they name
# (PLACED_EMBEDS, below: named as the vision tower's output it takes).
MROPE_OFFSETS = Port("mrope_offsets", i64, 2, Role.ROW)  # [T, 3]
IMAGE_ROWS = Port("image_rows", i64, 1, Role.IMAGE)  # [I]: the packed row each embedding replaces
# Inputs naming rows.
LOGITS_INDICES = Port("logits_indices", i64, 1, Role.INDEX)  # a target's rows whose logits are returned
CANDIDATE_INDICES = Port("candidate_indices", i64, 1, Role.INDEX)  # a draft's rows whose candidates are returned
STATE_ROWS = Port("state_rows", i64, 1, Role.STATE_INDEX)  # a hybrid target's rows whose states are returned
# The paged layout (ovbuild.runtime.cache.kv_cache fills it) and the caches.
PAST_LENS = Port("past_lens", i32, 1, Role.LAYOUT)
SUBSEQUENCE_BEGINS = Port("subsequence_begins", i32, 1, Role.LAYOUT)
BLOCK_INDICES = Port("block_indices", i32, 1, Role.LAYOUT)
BLOCK_INDICES_BEGINS = Port("block_indices_begins", i32, 1, Role.LAYOUT)
MAX_CONTEXT_LEN = Port("max_context_len", i32, 0, Role.LAYOUT)
KEY_CACHE = Port("key_cache.", ov.Type.dynamic, 4, Role.CACHE)
VALUE_CACHE = Port("value_cache.", ov.Type.dynamic, 4, Role.CACHE)
# A hybrid target's linear-attention states, in and out.
CONV_STATE = Port("conv_state.", f32, 3, Role.STATE)
RECURRENT_STATE = Port("recurrent_state.", f32, 4, Role.STATE)
CONV_STATE_OUT = Port("conv_state_out.", f32, 3, Role.STATE_OUTPUT)
RECURRENT_STATE_OUT = Port("recurrent_state_out.", f32, 4, Role.STATE_OUTPUT)
# Outputs.
LOGITS = Port("logits", f32, 2, Role.OUTPUT)
GREEDY_IDS = Port("greedy_ids", i64, 1, Role.OUTPUT)  # the argmax of each returned row's logits
LAST_HIDDEN_STATE = Port("last_hidden_state", f32, 2, Role.OUTPUT)  # a draft's final hidden state per returned row
TAPS = Port(TAPS_IN, f32, 2, Role.ROW_OUTPUT)  # a target's taps output: the hidden states of the layers a draft reads
# A draft's Markov head: its inputs are the backbone's returned rows; its outputs per row.
HEAD_LOGITS = Port(LOGITS, f32, 2, Role.HEAD_INPUT)
DRAFT_HIDDEN_STATES = Port("draft_hidden_states", f32, 2, Role.HEAD_INPUT)
PREV_TOKEN_IDS = Port("prev_token_ids", i64, 1, Role.HEAD_INPUT)
CANDIDATE_BEGINS = Port("candidate_begins", i32, 1, Role.HEAD_INPUT)
CANDIDATE_IDS = Port("candidate_ids", i64, 2, Role.OUTPUT)  # the lattice: top-K candidates per row
EDGE_SCORES = Port("edge_scores", f32, 3, Role.OUTPUT)
CHAIN_IDS = Port("chain_ids", i64, 1, Role.OUTPUT)  # DSpark's exact chain
CONFIDENCE = Port("confidence", f32, 1, Role.OUTPUT)
PREDECESSOR_CONFIDENCE = Port("predecessor_confidence", f32, 2, Role.OUTPUT)
# GenAI IRs (stateful SDPA, [batch, tokens]); their outputs are LOGITS / LAST_HIDDEN_STATE.
GENAI_INPUT_IDS = Port(INPUT_IDS, i64, 2, Role.GENAI)
GENAI_POSITION_IDS = Port(POSITION_IDS, i64, 2, Role.GENAI)
ATTENTION_MASK = Port("attention_mask", i64, 2, Role.GENAI)
BEAM_IDX = Port("beam_idx", i32, 1, Role.GENAI)
INPUTS_EMBEDS = Port("inputs_embeds", f32, 3, Role.GENAI)
GENAI_TAPS_IN = Port(TAPS_IN, f32, 3, Role.GENAI)
# Vision towers (Qwen3.5 family): every image's patches packed into one call, as the image processor flattens
# them ([patches, C * T * P * P], each image's patches in merge-window order), each image's grid of patches
# (t, h, w) in its row; one output row per merged token, images in input order.
PIXEL_VALUES = Port("pixel_values", f32, 2, Role.VISION)
GRID_THW = Port("grid_thw", i64, 2, Role.VISION)
IMAGE_EMBEDS = Port("image_embeds", f32, 2, Role.VISION)
PLACED_EMBEDS = Port(IMAGE_EMBEDS, f32, 2, Role.IMAGE)  # [I, hidden]: a target's input, rows of the tower's output

# MiniCPM-V 4.7 vision tower (graph/vision/minicpm.py): N images of h_i x w_i patches, L = sum h_i * w_i.
MINICPM_PIXEL_VALUES = Port("pixel_values", f32, 4, Role.VISION)  # [1, C, p, L * p]: patches side by side
MINICPM_TARGET_SIZES = Port("target_sizes", i64, 2, Role.VISION)  # [N, 2]: each image's (h, w) in patches
IMAGE_TOKEN_COUNTS = Port("image_token_counts", i64, 1, Role.VISION)  # [N]: tokens of each image

PORTS: tuple[Port, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Port))
ROW_INPUTS: tuple[Port, ...] = tuple(p for p in PORTS if p.role is Role.ROW)
INDEX_INPUTS: tuple[Port, ...] = tuple(p for p in PORTS if p.role is Role.INDEX)
ROW_OUTPUTS: tuple[Port, ...] = tuple(p for p in PORTS if p.role is Role.ROW_OUTPUT)
LAYOUT_INPUTS: tuple[Port, ...] = tuple(p for p in PORTS if p.role is Role.LAYOUT)
CACHES: tuple[Port, ...] = tuple(p for p in PORTS if p.role is Role.CACHE)
STATES: tuple[Port, ...] = tuple(p for p in PORTS if p.role is Role.STATE)
IMAGE_INPUTS: tuple[Port, ...] = tuple(p for p in PORTS if p.role is Role.IMAGE)
STATE_OUTPUT_OF: dict[Port, Port] = {CONV_STATE: CONV_STATE_OUT, RECURRENT_STATE: RECURRENT_STATE_OUT}
