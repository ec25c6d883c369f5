"""DFlash v1 (z-lab DFlashDraftModel) and the Muse-Glimmer assistant, which is DFlash v1 under other tensor names."""

from __future__ import annotations

from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.draft_config import DraftConfig, dflash_fields
from ovbuild.weights.families.base import CheckpointLayout
from ovbuild.weights.tensor_names import layer_entries

DFLASH_TENSORS = {
    "fc": "fc.weight",  # [H, n * H_t]: concatenated target taps -> draft hidden
    "hidden_norm": "hidden_norm.weight",
    **layer_entries(""),
    "norm": "norm.weight",
}
MUSE_GLIMMER_TENSORS = {**DFLASH_TENSORS, "fc": "encoder.fc.weight", "hidden_norm": "encoder.output_norm_enc.weight"}


def parse(r: ConfigReader) -> DraftConfig:
    return DraftConfig(**dflash_fields(r, family="dflash", candidate_offset=1))


LAYOUT = CheckpointLayout(("DFlashDraftModel",), parse, DFLASH_TENSORS)
MUSE_GLIMMER = CheckpointLayout(("MuseGlimmerAssistantModel",), parse, MUSE_GLIMMER_TENSORS)
