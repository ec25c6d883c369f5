"""The drafter interface: what the scheduler needs from any draft family, one batched draft call per step."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ovbuild.errors import UnsupportedError
from ovbuild.runtime.cache.cache_manager import CacheManager
from ovbuild.runtime.decode.sampling import SamplingParams, sample_rows


@dataclass(frozen=True)
class DraftItem:
    """One sequence's share of a draft call."""

    seq_id: int
    context: np.ndarray | None  # [S, n * H_t] target taps of tokens the draft has not seen yet, or None
    anchor: int | None  # the last committed token, or None for a context-only row set (prompt still prefilling)
    num_tokens: int  # proposals wanted from this block
    sampling: SamplingParams | None = None  # None = greedy
    position: int = 0  # output position of the first proposed token (where its random draws come from)


class Proposal(list):
    """Proposed tokens, and for sampled ones `q` [n, V]: the distribution each was drawn from, for verification;
    q None: point masses (greedy proposals). Cut with `head`, which keeps q aligned (slicing drops it, and a sampled
    proposal verified as point masses stays lossless but accepts less). `logits` [n, V]: the rows a greedy proposal
    took its argmax from, when the drafter hands them over (a view of its output, valid until its next call), so that
    a constraint can mask them (ovbuild.runtime.structured.state)."""

    def __init__(self, tokens: list[int] = (), q: np.ndarray | None = None, logits: np.ndarray | None = None):
        super().__init__(tokens)
        self.q = q  # [n, V] or None
        self.logits = logits  # [n, V] or None

    def head(self, n: int) -> Proposal:
        return Proposal(self[:n], None if self.q is None else self.q[:n])


def sampled_proposal(item: DraftItem, logits: np.ndarray) -> Proposal:
    """Proposal drawn from the processed distribution of each candidate row: logits [n, V] -> n tokens with q."""
    tokens, q = sample_rows(logits[: item.num_tokens], item.sampling, item.position)
    return Proposal(tokens, q)


@dataclass(frozen=True)
class DrafterOption:
    """A constructor option of one family's drafter (RuntimeOptions.draft_options); the CLI offers each as
    `--name-with-dashes`."""

    name: str
    type: type
    default: object
    help: str
    choices: tuple | None = None


class Drafter(ABC):
    """A draft model with its own paged cache. `propose` packs every item into one call and returns proposals."""

    OPTIONS: tuple[DrafterOption, ...] = ()  # the family-specific constructor options a pipeline may pass
    target_layer_ids: tuple[int, ...]
    max_candidates: int  # proposals a full block yields
    candidate_offset: int = 1  # block rows before the first candidate row: a block proposing k tokens runs k + this
    tap_width: int  # width of a context row (the target taps the draft reads)
    infer_s: float = 0.0  # time spent inside draft inference calls, for the time split
    prefix_caching: bool = False  # whether `resume` can start a sequence on context rows its cache holds
    compile_s: float = 0.0  # of which compiling (ovbuild.runtime.model.static_rows): a one-off the call costs leave out

    @classmethod
    @abstractmethod
    def from_folder(cls, folder, model=None, **options) -> Drafter:
        """Load the drafter from an exported draft folder (options: device, cache precision, cache size); `model` is
        the folder's openvino_model.xml when the caller has read it already."""

    @abstractmethod
    def propose(self, items: list[DraftItem]) -> list[Proposal]:
        """Commit each item's context rows and return up to `num_tokens` proposed tokens per item (none if no
        anchor); a family that samples its proposals for sampling items gives them their `q`."""

    def describe(self) -> str:
        """How the draft model runs, as its device compiled it (device, math, KV cache precision)."""
        return "not reported"

    def compile_copies(self) -> None:  # noqa: B027 (optional hook: a drafter without copies has nothing to do)
        """Compile now what the drafter would compile on first use (static copies per row count)."""

    def computed_rows(self, rows: int) -> int:
        """Rows a call of `rows` rows computes (more where calls are padded, PagedModel.computed_rows)."""
        return rows

    def rows_run(self, rows: int) -> int:
        """Rows the last call, of `rows` rows, computed: its padding included (what its time is the cost of)."""
        return self.computed_rows(rows)

    @property
    @abstractmethod
    def cache_manager(self) -> CacheManager:
        """The draft cache, as the scheduler reserves it (one block of rows past a request's tokens, see
        `Scheduler.budgets`)."""

    def resume(self, seq_id: int, length: int) -> None:
        """Count the first `length` context rows of a new sequence as given: its cache holds them (a prefix hit the
        scheduler took through `cache_manager.resume`)."""
        if length:
            raise UnsupportedError(f"{type(self).__name__} cannot start a sequence on cached context rows")

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Release the sequence's cache blocks and state."""
