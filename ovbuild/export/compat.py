"""Does a draft fit the target it is paired with? Each failure names both sides and the values that disagree."""

from __future__ import annotations

from ovbuild.errors import CompatibilityError
from ovbuild.weights.draft_config import DraftConfig
from ovbuild.weights.target import TargetConfig


def check_draft_fits_target(
    draft: DraftConfig,
    draft_name: str,
    target: TargetConfig,
    target_name: str,
    fc_inputs: int | None = None,
    embeds_with_target: bool = True,
) -> None:
    """Raise CompatibilityError unless `draft` can run on the taps, embedding and vocabulary of `target`.

    fc_inputs: the draft's fc.weight input width when known; embeds_with_target: the draft borrows embed/lm_head.
    """
    d, t = f"draft {draft_name}", f"target {target_name}"
    layers = target.num_layers
    if draft.num_target_layers is not None and draft.num_target_layers != layers:
        raise CompatibilityError(
            f"{d} was trained on a target of {draft.num_target_layers} layers (num_target_layers) but {t} has {layers}"
        )
    beyond = [i for i in draft.target_layer_ids if i >= layers]
    if beyond:
        raise CompatibilityError(
            f"{d} taps target layers {list(draft.target_layer_ids)} but {t} has {layers} layers (0..{layers - 1}): "
            f"layer {beyond[0]} does not exist"
        )
    taps_width = draft.num_taps * target.hidden_size
    fc_width = fc_inputs if fc_inputs is not None else draft.num_taps * draft.target_hidden_size
    if fc_width != taps_width:
        raise CompatibilityError(
            f"{d} fc takes {fc_width} inputs but {t} gives {draft.num_taps} taps x hidden_size {target.hidden_size} "
            f"= {taps_width}"
        )
    if embeds_with_target and draft.hidden_size != target.hidden_size:
        raise CompatibilityError(
            f"{d} has hidden_size {draft.hidden_size} but {t} has {target.hidden_size}: the draft embeds tokens "
            "with the target's embedding table and lm_head"
        )
    if draft.vocab_size != target.vocab_size:
        raise CompatibilityError(f"{d} has vocab_size {draft.vocab_size} but {t} has {target.vocab_size}")
