"""DSparkDrafter: the DFlash backbone with candidate offset 0, then the Markov head IR in one extra call per step.

Proposals come from the head's exact greedy chain (default) or from a greedy walk of its Top-K lattice; a DeepSpec
DFlash draft (no head) proposes each row's argmax. Under sampling, chain and lattice proposals stay deterministic
(verified as point masses), while a DeepSpec DFlash draft samples each row from its processed distribution. With a
confidence head and a threshold > 0, a proposal stops before the first row whose confidence is below the threshold
(nothing is proposed when row 0 is). A greedy proposal carries its rows' backbone logits, so that where a constraint
refuses a token the draft's best allowed token by them takes its place (ovbuild.runtime.structured.state).
"""

from __future__ import annotations

import numpy as np
import openvino as ov

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.ir.ports import (
    CANDIDATE_IDS,
    CHAIN_IDS,
    CONFIDENCE,
    EDGE_SCORES,
    GREEDY_IDS,
    LOGITS,
    PREDECESSOR_CONFIDENCE,
)
from ovbuild.runtime.speculation.drafters.base import DrafterOption, DraftItem, Proposal, sampled_proposal
from ovbuild.runtime.speculation.drafters.markov import MarkovDrafter
from ovbuild.runtime.speculation.lattice import walk_tokens

MARKOV_MODES = ("chain", "lattice")


class DSparkDrafter(MarkovDrafter):
    """A DSpark or DeepSpec DFlash draft; markov_mode: chain (exact greedy) or lattice; confidence_threshold 0 = off."""

    OPTIONS = (
        DrafterOption(
            "markov_mode", str, "chain", "DSpark: exact greedy chain (default) or the Top-K lattice walk", MARKOV_MODES
        ),
        DrafterOption(
            "confidence_threshold",
            float,
            0.0,
            "DSpark: stop a proposal before the first row whose confidence is below this (0 = off)",
        ),
    )

    def __init__(
        self,
        model: ov.Model,
        head: ov.Model | None = None,
        markov_mode: str = "chain",
        confidence_threshold: float = 0.0,
        device: str = "CPU",
        **options,
    ):
        if markov_mode not in MARKOV_MODES:
            raise ConfigError(f"markov_mode '{markov_mode}' is not one of {', '.join(MARKOV_MODES)}")
        if not 0.0 <= confidence_threshold <= 1.0:
            raise ConfigError(f"confidence_threshold = {confidence_threshold} must lie in [0, 1] (0 = off)")
        super().__init__(model, head, device, **options)
        self.markov_mode, self.confidence_threshold = markov_mode, confidence_threshold
        if head is None and self.ir.markov_head:
            raise ConfigError(f"this DSpark draft has a Markov head: pass its IR ({self.ir.markov_head}.xml)")
        if head is None and markov_mode == "lattice":
            raise UnsupportedError("markov_mode 'lattice': this draft has no Markov head (markov_rank 0)")
        if head is not None and markov_mode not in self.head_ir.forms:
            raise UnsupportedError(
                f"the Markov head IR holds the {' and '.join(self.head_ir.forms)} form, not the {markov_mode} "
                "(rebuild the head with the lattice: ovbuild.graph.dspark.build_lattice_markov_head)"
            )
        outputs = {o.get_any_name() for o in model.outputs} | self.head_outputs
        if confidence_threshold > 0 and CONFIDENCE not in outputs and PREDECESSOR_CONFIDENCE not in outputs:
            raise UnsupportedError(f"confidence_threshold = {confidence_threshold}: this draft has no confidence head")

    def choose(
        self, items: list[DraftItem], outputs: dict[str, np.ndarray], candidate_begins: np.ndarray
    ) -> list[Proposal]:
        """Tokens of every candidate row (chain, lattice walk or argmax), cut by confidence and `num_tokens`."""
        if candidate_begins[-1] == 0:  # context rows only (prompts still prefilling): nothing to propose
            return [Proposal() for _ in items]
        if self.head is not None:
            outputs = {**outputs, **self.run_head(items, outputs, candidate_begins)}
        confidence = outputs.get(CONFIDENCE)  # [R]
        if self.head is None:
            tokens = outputs[GREEDY_IDS]
        elif self.markov_mode == "chain":
            tokens = outputs[CHAIN_IDS]
        else:
            tokens, chosen = walk_tokens(outputs[CANDIDATE_IDS], outputs[EDGE_SCORES], candidate_begins)  # [R], [R]
            if PREDECESSOR_CONFIDENCE in outputs:
                previous = previous_choice(chosen, candidate_begins)  # [R]
                confidence = np.take_along_axis(outputs[PREDECESSOR_CONFIDENCE], previous[:, None], -1)[:, 0]
        proposals = []
        for i, item in enumerate(items):
            b, e = candidate_begins[i], candidate_begins[i + 1]
            keep = confident_rows(confidence[b:e], self.confidence_threshold) if confidence is not None else e - b
            if self.head is None and item.sampling is not None and item.num_tokens > 0:
                proposals.append(sampled_proposal(item, outputs[LOGITS][b:e]).head(keep))
            else:  # the backbone's rows ride along (a view) for a constraint to mask
                n = min(keep, item.num_tokens)
                proposals.append(Proposal(tokens[b:e][:n].tolist(), logits=outputs[LOGITS][b:e][:n]))
        return proposals


def confident_rows(confidence: np.ndarray, threshold: float) -> int:
    """Rows kept: those before the first row with confidence strictly below `threshold` (0 = all rows)."""
    if threshold <= 0:
        return len(confidence)
    low = np.flatnonzero(confidence < threshold)
    return int(low[0]) if len(low) else len(confidence)


def previous_choice(chosen: np.ndarray, candidate_begins: np.ndarray) -> np.ndarray:
    """Predecessor index of every row on the walked path: the previous row's choice, 0 on first rows: [R] -> [R]."""
    previous = np.concatenate([[0], chosen[:-1]])
    previous[np.asarray(candidate_begins[:-1], np.int64)[np.diff(candidate_begins) > 0]] = 0
    return previous
