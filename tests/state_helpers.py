"""A toy recurrent "target" behind the StatePool contract, so that the pool and the scheduler's hook are tested on
their own: per row, the conv state shifts in the token and the recurrent state decays and adds the conv state; the
next token is a hash of the whole state, so a state kept from the wrong row changes the output."""

from __future__ import annotations

import numpy as np

from ovbuild.runtime.cache.cache_manager import BlocksAndSlots
from ovbuild.runtime.cache.kv_cache import BlockAllocator, SequenceRows
from ovbuild.runtime.cache.state_pool import StatePool, StateSpec
from ovbuild.runtime.speculation.drafters.base import Drafter, DraftItem, Proposal

VOCAB = 97
SPECS = [
    StateSpec("conv_state.0", "conv_state_out.0", (3, 2)),
    StateSpec("recurrent_state.0", "recurrent_state_out.0", (2, 3, 2)),
    StateSpec("conv_state.2", "conv_state_out.2", (3, 2)),
    StateSpec("recurrent_state.2", "recurrent_state_out.2", (2, 3, 2)),
]


def step_state(state: dict[str, np.ndarray], token: int) -> dict[str, np.ndarray]:
    """One row of the toy recurrence on one sequence's state (f32, same operations whatever the packing)."""
    new = {}
    for layer in (0, 2):
        conv = np.roll(state[f"conv_state.{layer}"], -1, axis=-1)
        conv[:, -1] = np.float32(token % 13) * np.float32(0.25) + np.float32(layer)
        rec = state[f"recurrent_state.{layer}"] * np.float32(0.5) + conv.sum(axis=-1)[None, :, None]
        new[f"conv_state.{layer}"], new[f"recurrent_state.{layer}"] = conv, rec.astype(np.float32)
    return new


def zero_state() -> dict[str, np.ndarray]:
    return {s.name: np.zeros(s.shape, np.float32) for s in SPECS}


def replay(tokens: list[int]) -> dict[str, np.ndarray]:
    """The state after `tokens` from a new sequence, one row at a time: what the pool must hold."""
    state = zero_state()
    for t in tokens:
        state = step_state(state, t)
    return state


def next_token(state: dict[str, np.ndarray]) -> int:
    return int(sum(float(np.abs(a).sum()) * (i + 1) for i, a in enumerate(state.values())) * 1000) % VOCAB


def toy_call(pool: StatePool, rows: list[SequenceRows], ids: list[int], keep_rows) -> tuple[dict, np.ndarray]:
    """One packed call through the pool: the state inputs it gathers, the toy recurrence per sequence, the reported
    outputs at `state_rows`; returns (outputs, greedy token after every row)."""
    inputs = pool.inputs(rows, keep_rows)
    per_row, greedy, begin = [], [], 0
    for s, r in enumerate(rows):
        state = {spec.name: inputs[spec.name][s] for spec in SPECS}
        for t in ids[begin : begin + r.num_rows]:
            state = step_state(state, t)
            per_row.append(state)
            greedy.append(next_token(state))
        begin += r.num_rows
    chosen = [per_row[q] for q in inputs["state_rows"]]
    outputs = {spec.output: np.stack([c[spec.name] for c in chosen]) for spec in SPECS}
    pool.report(outputs)
    return outputs, np.array(greedy, np.int64)


class ToyHybridTarget:
    """Stands in for a compiled hybrid target where the scheduler touches it: a KV block allocator (the toy keeps no
    keys) and a StatePool behind one cache manager, `run`, `free`, and the greedy/logits/hidden_states outputs of a
    paged target."""

    vocab_size = VOCAB

    def __init__(self, num_blocks: int = 64, slots: int = 4):
        self.cache = type("Cache", (), {})()
        self.cache.allocator = BlockAllocator(num_blocks, 16)
        self.states = StatePool(SPECS, slots)
        self.cache_manager = BlocksAndSlots(self.cache.allocator, self.states)
        self.row_subsequences = False  # as PagedModel: a sequence with states steps its rows in one subsequence
        self.compile_s = 0.0  # as PagedModel: no static copies
        self.can_skip_taps = self.taps_optional = False  # as PagedModel with states: every call has its taps
        self.image_width = None  # as PagedModel of a text-only target: no image inputs
        self.calls = 0

    def run(
        self, rows: list[SequenceRows], inputs: dict[str, np.ndarray], state_rows=None, taps: bool = True
    ) -> dict[str, np.ndarray]:
        self.calls += 1
        for r in rows:
            self.cache.allocator.reserve(r.seq_id, r.past_len + r.num_rows)
        _, greedy = toy_call(self.states, rows, np.asarray(inputs["input_ids"]).tolist(), state_rows)
        wanted = inputs["logits_indices"]
        logits = np.zeros((len(wanted), VOCAB), np.float32)
        logits[np.arange(len(wanted)), greedy[wanted]] = 1.0
        hidden = np.zeros((len(greedy), 1), np.float32)  # taps for the draft: the toy draft ignores them
        return {"greedy_ids": greedy[wanted], "logits": logits, "hidden_states": hidden}

    def computed_rows(self, rows: int) -> int:
        return rows  # as PagedModel without static copies

    def free(self, seq_id: int) -> None:
        self.cache_manager.free(seq_id)


class RandomDrafter(Drafter):
    """A draft that proposes random tokens (wrapped in a SteeredDrafter, its proposals are replaced)."""

    target_layer_ids, max_candidates, candidate_offset, tap_width = (), 7, 1, 1

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.blocks = BlockAllocator(4096, 16)  # the toy draft keeps no cache: room for any test

    @property
    def cache_manager(self) -> BlockAllocator:
        return self.blocks

    @classmethod
    def from_folder(cls, folder, model=None, **options) -> RandomDrafter:
        return cls()

    def propose(self, items: list[DraftItem]) -> list[Proposal]:
        return [
            Proposal(self.rng.integers(0, VOCAB, i.num_tokens if i.anchor is not None else 0).tolist()) for i in items
        ]

    def free(self, seq_id: int) -> None:
        self.blocks.free(seq_id)
