"""The DSpark Markov head's inputs, weights and per-row formulas, which its exact chain (`ovbuild.graph.dspark`) and
its Top-K lattice (`ovbuild.graph.dspark_lattice`) share."""

from __future__ import annotations

import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, i64, named, parameter
from ovbuild.graph.weights import WeightPolicy, f32_constant
from ovbuild.ir.ports import CANDIDATE_BEGINS, DRAFT_HIDDEN_STATES, HEAD_LOGITS, PREV_TOKEN_IDS
from ovbuild.weights.families.dspark import DSparkConfig
from ovbuild.weights.tensor_names import WeightSource


class MarkovHead:
    """The head IR's inputs and weights, and the per-row formulas that the chain and the lattice share.

    Inputs: logits [R, V] f32 (candidate rows of every sequence, packed), prev_token_ids [S] i64 (each sequence's
    anchor), candidate_begins [S+1] i32 (prefix sums of candidate rows per sequence), and draft_hidden_states [R, H]
    f32 when the gate or the confidence head reads it.
    """

    def __init__(self, cfg: DSparkConfig, draft: WeightSource, policy: WeightPolicy):
        self.cfg = cfg
        self.policy = policy = policy.uncompressed()
        h, v, r = cfg.hidden_size, cfg.vocab_size, cfg.markov_rank
        self.logits = parameter(HEAD_LOGITS, [-1, v])
        self.prev_token_ids = parameter(PREV_TOKEN_IDS, [-1])
        self.candidate_begins = parameter(CANDIDATE_BEGINS, [-1])
        self.gated = cfg.markov_head_type == "gated"
        self.with_confidence = cfg.confidence_head_with_markov
        self.hidden = parameter(DRAFT_HIDDEN_STATES, [-1, h]) if self.gated or self.with_confidence else None

        def matrix(name: str, shape: tuple[int, int], role: str = "linear") -> Output:
            return policy.matrix(draft.get(name, shape), name.replace(".", "/"), role=role)

        self.w1 = matrix("markov_head.markov_w1", (v, r), role="embedding")  # [V, r]
        self.w2 = matrix("markov_head.markov_w2", (v, r))  # [V, r]
        if self.gated:
            gate = matrix("markov_head.gate_proj", (r, h + r))  # [r, H + r] acting on [h ; e]
            self.gate_h, self.gate_e = split_columns(gate, h, "markov_head/gate_proj")
            self.gate_bias = f32_constant(draft.get("markov_head.gate_proj.bias", (r,)), "markov_head/gate_proj/bias")
        if self.with_confidence:
            w = matrix("confidence_head.proj", (1, cfg.confidence_width))  # [1, H + r] acting on [h ; e]
            self.confidence_h, self.confidence_e = split_columns(w, h, "confidence_head/proj")
            self.confidence_bias = f32_constant(draft.get("confidence_head.proj.bias", (1,)), "confidence_head/bias")

    @property
    def parameters(self) -> list[ov.Node]:
        params = [self.logits, self.prev_token_ids, self.candidate_begins]
        return params + ([self.hidden] if self.hidden is not None else [])

    def embed(self, token_ids: Output, path: str) -> Output:
        """W1 rows of the previous tokens: ids [...] -> [..., r]."""
        return named(ops.gather(self.w1, token_ids, i64(0)), path)

    def gate(self, e: Output, h: Output | None, path: str) -> Output:
        """The vector the bias is made of: e itself (vanilla) or sigmoid(gate_proj [h ; e]) * e (gated).

        e [..., r]; h [..., H] broadcastable against e's leading axes (unused by the vanilla head).
        """
        if not self.gated:
            return e
        hidden_part = ops.matmul(h, self.gate_h, False, True)  # [..., r]
        pre = ops.add(ops.add(hidden_part, ops.matmul(e, self.gate_e, False, True)), self.gate_bias)  # [..., r]
        return named(ops.multiply(ops.sigmoid(pre), e), path)

    def bias(self, v: Output, path: str) -> Output:
        """Full-vocabulary bias W2 v: [..., r] -> [..., V]."""
        return named(ops.matmul(v, self.w2, False, True), path)

    def confidence(self, h: Output, e: Output, path: str) -> Output:
        """sigmoid(w . [h ; e] + b): h [..., H] broadcastable against e [..., r] -> [...]."""
        logit = ops.add(
            ops.add(ops.matmul(h, self.confidence_h, False, True), ops.matmul(e, self.confidence_e, False, True)),
            self.confidence_bias,
        )  # [..., 1]
        return named(ops.squeeze(ops.sigmoid(logit), i64([-1])), path)

    def first_rows(self) -> Output:
        """Each sequence's first candidate row, clamped into [0, R-1] for sequences without rows: [S] i64."""
        begins = ops.convert(self.candidate_begins, ov.Type.i64)
        firsts = ops.slice(begins, i64([0]), i64([-1]), i64([1]))  # [S]
        return named(ops.minimum(firsts, last_row(self.logits.output(0))), "markov_head/first_rows")


def split_columns(w: Output, first: int, path: str) -> tuple[Output, Output]:
    """[out, first + rest] -> ([out, first], [out, rest]): the weight's blocks acting on each part of a concat."""
    parts = ops.variadic_split(w, i64(1), i64([first, -1]), name=f"{path}/split")
    return parts.output(0), parts.output(1)


def last_row(x: Output) -> Output:
    """Index of the last row of x [R, ...] as a [1] i64 tensor."""
    return ops.subtract(ops.gather(ops.shape_of(x, ov.Type.i64), i64([0]), i64(0)), i64([1])).output(0)
