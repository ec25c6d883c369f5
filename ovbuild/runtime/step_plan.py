"""A scheduling step's plan: the target call's rows per request, and who was admitted or preempted for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ovbuild.runtime.request import Request


@dataclass
class TargetRows:
    """One request's share of the target call: its rows' tokens, and the rows whose logits are read."""

    request: Request
    tokens: list[int]
    wanted: list[int]
    start: int  # the request's committed length before the call (its rows' first position)


@dataclass
class StepPlan:
    """What one step does: who was admitted (with the cached tokens each starts on), who was preempted, the blocks
    taken per cache, the target call's rows, and the draft length each decoding request has verified in them (chosen
    by the previous step's DraftPlan)."""

    rows: list[TargetRows] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    hits: dict[int, int] = field(default_factory=dict)  # request id -> cached tokens it starts on
    preempted: list[Request] = field(default_factory=list)
    new_blocks: dict[str, int] = field(default_factory=dict)  # cache name -> blocks taken while planning
    taps: bool = False  # whether the target call computes taps
    decode_taps: bool = True  # whether verification rows keep theirs (else a gap, caught up if the request drafts)
    draft_lengths: dict[int, int] = field(default_factory=dict)  # decoding request id -> proposals verified (its k)
