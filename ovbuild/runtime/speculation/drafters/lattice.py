"""LatticeDrafter: a DFlash v2 backbone plus its selector, a Markov head IR scoring a packed Top-K lattice.

Per step: one backbone call, one head call on the candidate rows of every sequence, then the greedy walk over the
lattice from each sequence's anchor. A proposal carries its rows' backbone logits: where a constraint refuses a walked
token, the draft's best allowed token by those logits takes its place (ovbuild.runtime.structured.state).
"""

from __future__ import annotations

import numpy as np
import openvino as ov

from ovbuild.errors import ConfigError
from ovbuild.ir import MARKOV_HEAD_STEM
from ovbuild.ir.ports import CANDIDATE_IDS, EDGE_SCORES, LOGITS
from ovbuild.runtime.speculation.drafters.base import DraftItem, Proposal
from ovbuild.runtime.speculation.drafters.markov import MarkovDrafter
from ovbuild.runtime.speculation.lattice import greedy_walk


class LatticeDrafter(MarkovDrafter):
    """Proposals from the lattice walk instead of the per-row argmax."""

    def __init__(self, model: ov.Model, head: ov.Model | None, device: str = "CPU", **options):
        if head is None:
            raise ConfigError(f"a DFlash v2 draft proposes through its selector: pass its IR ({MARKOV_HEAD_STEM}.xml)")
        super().__init__(model, head, device, **options)

    def choose(
        self, items: list[DraftItem], outputs: dict[str, np.ndarray], candidate_begins: np.ndarray
    ) -> list[Proposal]:
        if candidate_begins[-1] == 0:
            return [Proposal() for _ in items]
        lattice = self.run_head(items, outputs, candidate_begins)
        paths = greedy_walk(lattice[CANDIDATE_IDS], lattice[EDGE_SCORES], candidate_begins)
        logits = outputs[LOGITS]  # [R, V]: the rows the lattice's candidates came from (a view, as in BlockDrafter)
        return [
            Proposal(path[: item.num_tokens].tolist(), logits=logits[b : b + item.num_tokens])
            for path, item, b in zip(paths, items, candidate_begins[:-1], strict=True)
        ]
