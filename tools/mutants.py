"""The planted bugs of tools/mutation_check.py, as data: each a text substitution in one file and the tests that
should catch it. Add a mutant here for every bug class a change could bring back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """Replace `old` (which must occur exactly once) by `new` in `path`, then run `tests`."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


PARITY = ("tests/test_config_parity.py", "tests/test_paged_parity.py")
DRAFT_PARITY = ("tests/test_config_parity.py", "tests/test_paged_parity.py", "tests/test_dflash2_parity.py")
SPECULATIVE = (
    "tests/test_drafter_proposals.py",
    "tests/test_speculative.py",
    "tests/test_speculative_families.py",
    "tests/test_dspark_speculative.py",
)
BF16 = ("tests/test_paged_parity.py", "tests/test_reference.py", "tests/test_dflash2_parity.py")
QUANTIZED = ("tests/test_compression.py",)
PLANNER = ("tests/test_speculation.py",)
CALL_COST = ("tests/test_call_cost.py",)
SAMPLING = ("tests/test_sampling.py", "tests/test_sampling_e2e.py")
CALLS = ("tests/test_binding.py", "tests/test_row_padding.py", "tests/test_paged_parity.py")
UNTAPPED = ("tests/test_untapped.py",)
PREFIX = ("tests/test_kv_cache.py", "tests/test_prefix_caching.py", "tests/test_hybrid_prefix_caching.py")
NARROW = ("tests/test_narrow_weights.py",)
MOE = ("tests/test_moe.py",)
AFFINITY = ("tests/test_affinity.py",)

MUTANTS = (
    # -- the first planted bugs: graph builders, references, RoPE, cache layout, scheduler -----------------------------
    Mutant(
        "graph-rope-yarn-cos-only",
        "ovbuild/graph/rope.py",
        "ops.multiply(cos, const(rope.attention_scaling)), ops.multiply(sin, const(rope.attention_scaling))",
        "ops.multiply(cos, const(rope.attention_scaling)), sin",
        PARITY,
    ),
    Mutant(
        "graph-norm-eps-outside-sqrt",
        "ovbuild/graph/norm.py",
        "ops.divide(x, ops.sqrt(ops.add(mean_sq, const(eps))))",
        "ops.divide(x, ops.add(ops.sqrt(mean_sq), const(eps)))",
        PARITY,
    ),
    Mutant(
        "rope-linear-multiplies",
        "ovbuild/weights/rope.py",
        "return base / self.factor",
        "return base * self.factor",
        PARITY,
    ),
    Mutant(
        "metrics-per-position-reversed",
        "ovbuild/runtime/metrics.py",
        "self.accepted_per_position[i] += 1",
        "self.accepted_per_position[proposed - 1 - i] += 1",
        ("tests/test_metrics.py", *SPECULATIVE),
    ),
    Mutant(
        "rope-inv-freq-exponent",
        "ovbuild/weights/rope.py",
        "np.arange(0, head_dim, 2, dtype=np.float64) / head_dim",
        "np.arange(0, head_dim // 2, dtype=np.float64) / head_dim",
        PARITY,
    ),
    Mutant(
        "reader-bf16-square-transposed",
        "ovbuild/weights/safetensors_file.py",
        "        return WeightTensor(name, info.dtype, array)\n",
        "        if info.dtype == 'bf16' and array.ndim == 2 and array.shape[0] == array.shape[1]:\n"
        "            array = array.T\n"
        "        return WeightTensor(name, info.dtype, array)\n",
        BF16,
    ),
    Mutant(
        "dtypes-bf16-widening-transposes-square",
        "ovbuild/weights/dtypes.py",
        "        return bf16_to_f32(array)\n",
        "        return bf16_to_f32(array).T if array.ndim == 2 and array.shape[0] == array.shape[1] "
        "else bf16_to_f32(array)\n",
        QUANTIZED,
    ),
    Mutant(
        "scheduler-rejected-taps-committed",
        "ovbuild/runtime/verification.py",
        "request.add_taps(taps[: accepted + 1])",
        "request.add_taps(taps)",
        SPECULATIVE,
    ),
    Mutant(
        "drafter-candidate-rows-off-by-one",
        "ovbuild/runtime/speculation/drafters/block.py",
        "first = len(ids) - block + offset",
        "first = len(ids) - block",
        SPECULATIVE,
    ),
    Mutant(
        "kv-begins-from-reserved",
        "ovbuild/runtime/cache/kv_cache.py",
        "BLOCK_INDICES_BEGINS: [0, *accumulate(counts)]",
        "BLOCK_INDICES_BEGINS: [0, *accumulate(len(self.allocator.tables[r.seq_id]) for r in rows)]",
        PARITY,
    ),
    # -- the shared RoPE code (graph builders only since the reference computes its own) ------------------------------
    Mutant(
        "rope-yarn-ramp-reversed",
        "ovbuild/weights/rope.py",
        "extrapolation_weight = 1 - ramp",
        "extrapolation_weight = ramp",
        PARITY,
    ),
    Mutant(
        "rope-yarn-mscale-swapped",
        "ovbuild/weights/rope.py",
        "get_mscale(self.factor, self.mscale) / get_mscale(self.factor, self.mscale_all_dim)",
        "get_mscale(self.factor, self.mscale_all_dim) / get_mscale(self.factor, self.mscale)",
        PARITY,
    ),
    Mutant(
        "rope-yarn-truncate-ignored",
        "ovbuild/weights/rope.py",
        "        if self.truncate:\n",
        "        if True:\n",
        PARITY,
    ),
    Mutant(
        "rope-llama3-blend-swapped",
        "ovbuild/weights/rope.py",
        "smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled",
        "smoothed = smooth * scaled / self.factor + (1 - smooth) * scaled",
        PARITY,
    ),
    # -- graph builders ------------------------------------------------------------------------------------------------
    Mutant(
        "graph-rotate-half-sign",
        "ovbuild/graph/rope.py",
        "rotated = ops.concat([ops.negative(second), first], -1)",
        "rotated = ops.concat([second, ops.negative(first)], -1)",
        PARITY,
    ),
    Mutant(
        "graph-attention-scale",
        "ovbuild/graph/paged_attention.py",
        "const(1.0 / np.sqrt(head_dim)),  # 9 scale",
        "const(1.0 / head_dim),  # 9 scale",
        PARITY,
    ),
    Mutant(
        "graph-silu-on-up",
        "ovbuild/graph/decoder.py",
        "hidden = named(ops.multiply(ops.swish(gate), up),",
        "hidden = named(ops.multiply(ops.swish(gate), ops.swish(up)),",
        PARITY,
    ),
    Mutant(
        "graph-last-tap-before-norm",
        "ovbuild/graph/decoder.py",
        '    states[-1] = norm(ctx, x, "norm")',
        '    states.append(norm(ctx, x, "norm"))',
        PARITY,
    ),
    Mutant(
        "graph-softcap-without-division",
        "ovbuild/graph/dflash.py",
        "ops.multiply(ops.tanh(ops.divide(logits, const(cap))), const(cap))",
        "ops.multiply(ops.tanh(logits), const(cap))",
        DRAFT_PARITY,
    ),
    Mutant(
        "graph-block-slot-off-by-one",
        "ovbuild/graph/dflash.py",
        "ops.cumsum(ops.convert(rows.is_block, ov.Type.i64), i64(0)), i64(1))",
        "ops.cumsum(ops.convert(rows.is_block, ov.Type.i64), i64(0)), i64(0))",
        DRAFT_PARITY,
    ),
    # -- numpy references ---------------------------------------------------------------------------------------------
    Mutant(
        "reference-norm-eps-outside-sqrt",
        "ovbuild/reference/layers.py",
        "np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)",
        "(np.sqrt(np.mean(x * x, axis=-1, keepdims=True)) + eps)",
        PARITY,
    ),
    Mutant(
        "reference-gqa-tiled",
        "ovbuild/reference/layers.py",
        "    k = np.repeat(k, group, axis=1)  # [T, H, D]\n    v = np.repeat(v, group, axis=1)\n",
        "    k = np.tile(k, (1, group, 1))  # [T, H, D]\n    v = np.tile(v, (1, group, 1))\n",
        PARITY,
    ),
    Mutant(
        "reference-yarn-attention-factor-dropped",
        "ovbuild/reference/rope.py",
        "return ReferenceRope(inv_freq, float(attention_factor))",
        "return ReferenceRope(inv_freq)",
        PARITY,
    ),
    Mutant(
        "reference-bf16-byte-order",
        "ovbuild/reference/weights.py",
        "words[:, 2:] = pairs",
        "words[:, 2:] = pairs[:, ::-1]",
        BF16,
    ),
    # -- cache layout ------------------------------------------------------------------------------------------------
    Mutant(
        "kv-indices-from-reserved",
        "ovbuild/runtime/cache/kv_cache.py",
        "for b in reserve(r.seq_id, end)[:n]]",
        "for b in reserve(r.seq_id, end)]",
        PARITY,
    ),
    Mutant(
        "kv-context-bound-below-the-longest-sequence",
        "ovbuild/runtime/cache/kv_cache.py",
        "return max(MIN_CONTEXT_BOUND, 1 << (longest - 1).bit_length()) if longest > 0 else 0",
        "return longest - 1 if longest > 0 else 0",
        PARITY,
    ),
    Mutant(
        "kv-free-keeps-blocks",
        "ovbuild/runtime/cache/kv_cache.py",
        "            if self.refs[block] == 0:\n                self._free[block] = None\n",
        "            if False:\n                self._free[block] = None\n",
        ("tests/test_kv_cache.py", *SPECULATIVE),
    ),
    Mutant(
        "kv-free-evicts-registered-blocks-first",
        "ovbuild/runtime/cache/kv_cache.py",
        "                if block not in self.block_hash:\n",
        "                if True:\n",
        PREFIX,
    ),
    Mutant(
        "kv-register-overwrites-a-registered-hash",
        "ovbuild/runtime/cache/kv_cache.py",
        "if block not in self.block_hash and digest not in self.cached:",
        "if block not in self.block_hash:",
        PREFIX,
    ),
    Mutant(
        "request-recomputed-without-its-generated-tokens",
        "ovbuild/runtime/request.py",
        "return len(self.prompt) + max(len(self.generated) - 1, 0)",
        "return len(self.prompt)",
        PREFIX,
    ),
    Mutant(
        "prefix-hit-takes-the-last-context-token",
        "ovbuild/runtime/admission.py",
        "limit = request.context_len - 1",
        "limit = request.context_len",
        PREFIX,
    ),
    Mutant(
        "hybrid-hit-without-its-snapshot",
        "ovbuild/runtime/cache/cache_manager.py",
        "            self.states.restore(seq_id, self.snapshots[digest])\n",
        "",
        PREFIX,
    ),
    # -- scheduler and metrics ----------------------------------------------------------------------------------------
    Mutant(
        "scheduler-anchor-not-committed",
        "ovbuild/runtime/verification.py",
        "request.target_len += accepted + 1  #",
        "request.target_len += accepted  #",
        SPECULATIVE,
    ),
    Mutant(
        "commit-never-accepts-whole-proposal",
        "ovbuild/runtime/commit.py",
        "while accepted < len(proposal) and proposal[accepted] == best(accepted):",
        "while accepted < len(proposal) - 1 and proposal[accepted] == best(accepted):",
        SPECULATIVE,
    ),
    Mutant(
        "metrics-histogram-shifted",
        "ovbuild/runtime/metrics.py",
        "self.accepted_histogram[accepted] += 1",
        "self.accepted_histogram[accepted - 1] += 1",
        ("tests/test_metrics.py", *SPECULATIVE),
    ),
    Mutant(
        "metrics-run-drops-generated",
        "ovbuild/runtime/metrics.py",
        "        r.num_generated_tokens += m.num_generated_tokens\n",
        "",
        ("tests/test_metrics.py", *SPECULATIVE),
    ),
    # -- adaptive draft length and sampling ---------------------------------------------------------------------------
    Mutant(
        "speculation-survival-summed",
        "ovbuild/runtime/speculation/planner.py",
        "chance *= (accepted + REQUEST_WEIGHT * run) / (reached + REQUEST_WEIGHT)",
        "chance += (accepted + REQUEST_WEIGHT * run) / (reached + REQUEST_WEIGHT)",
        PLANNER,
    ),
    Mutant(
        "speculation-plan-one-proposal-too-many",
        "ovbuild/runtime/speculation/planner.py",
        "for _, request, _ in order[:best]:",
        "for _, request, _ in order[: best + 1]:",
        PLANNER,
    ),
    Mutant(
        "speculation-draft-call-free",
        "ovbuild/runtime/speculation/planner.py",
        "(draft[m] + draft_host_s if m or anyway else 0.0)",
        "0.0",
        PLANNER,
    ),
    Mutant(
        "speculation-cost-not-monotone",
        "ovbuild/runtime/speculation/call_cost.py",
        "self._fit = self.rows[self.seen], _monotone(now, np.maximum(calls, 1)), drift",
        "self._fit = self.rows[self.seen], now, drift",
        CALL_COST,
    ),
    Mutant(
        "speculation-cost-latest-call-only",
        "ovbuild/runtime/speculation/call_cost.py",
        "sorted(recent, key=lambda call: call[1])[middle]",
        "recent[-1]",
        CALL_COST,
    ),
    Mutant(
        "speculation-cost-keeps-calls-at-the-rows-asked",
        "ovbuild/runtime/speculation/call_cost.py",
        "        rows = self._rows(rows)\n        b = bucket(rows)",
        "        b = bucket(rows)",
        CALL_COST,
    ),
    Mutant(
        "speculation-cost-prices-the-rows-asked",
        "ovbuild/runtime/speculation/call_cost.py",
        "rows = np.where(rows < len(self._computed), self._computed[np.minimum(rows, len(self._computed) - 1)], rows)",
        "rows = rows",
        ("tests/test_call_cost.py", "tests/test_speculation.py"),
    ),
    Mutant(
        "static-copies-compute-the-rows-asked",
        "ovbuild/runtime/model/paged_model.py",
        "return padded_rows(rows) if self.static is not None else rows",
        "return rows",
        ("tests/test_static_rows.py",),
    ),
    Mutant(
        "speculation-cost-without-drift",
        "ovbuild/runtime/speculation/call_cost.py",
        "            self.own_drift *= ratio**self.drift_rate\n",
        "            pass\n",
        CALL_COST,
    ),
    Mutant(
        "speculation-cost-stale-buckets-at-old-speed",
        "ovbuild/runtime/speculation/call_cost.py",
        "now = self.seconds[self.seen] * np.where(fresh, 1.0, drift / self.drift_then[self.seen])",
        "now = self.seconds[self.seen] * 1.0",
        CALL_COST,
    ),
    Mutant(
        "speculation-draft-cost-at-rows-asked",
        "ovbuild/runtime/draft_step.py",
        "self.speculation.draft_cost.observe(self.drafter.rows_run(rows), seconds)",
        "self.speculation.draft_cost.observe(rows, seconds)",
        PLANNER,
    ),
    Mutant(
        "speculation-host-for-the-run",
        "ovbuild/runtime/speculation/planner.py",
        "        if not self.learn_host or not self._host_plain:\n",
        "        if True:\n",
        PLANNER,
    ),
    Mutant(
        "speculation-drafts-on-an-outdated-plain-step",
        "ovbuild/runtime/speculation/planner.py",
        "        if not anyway and best and self.target_cost.outdated(fixed_target_rows):\n",
        "        if False:\n",
        PLANNER,
    ),
    Mutant(
        "speculation-no-exploration",
        "ovbuild/runtime/speculation/planner.py",
        "bonus = OPTIMISM * np.sqrt(plain * (1 - plain) / seen)",
        "bonus = 0.0 * seen",
        PLANNER,
    ),
    Mutant(
        "speculation-fixed-prior-for-deep-positions",
        "ovbuild/runtime/speculation/planner.py",
        "prior = (accepted + PRIOR_WEIGHT * prior) / (reached + PRIOR_WEIGHT)  # the next position's prior",
        "prior = (accepted + PRIOR_WEIGHT * PRIOR_ACCEPTANCE) / (reached + PRIOR_WEIGHT)",
        PLANNER,
    ),
    Mutant(
        "speculation-context-charged-in-full",
        "ovbuild/runtime/speculation/planner.py",
        "draft = (blocks_s + ingest / CATCH_UP_STEPS).tolist()",
        "draft = (blocks_s + ingest).tolist()",
        PLANNER,
    ),
    Mutant(
        "speculation-steady-context-at-a-share",
        "ovbuild/runtime/speculation/planner.py",
        "steady = np.minimum(context_rows, np.array(tokens))",
        "steady = 0 * np.array(tokens)",
        PLANNER,
    ),
    Mutant(
        "speculation-evidence-never-ages",
        "ovbuild/runtime/speculation/planner.py",
        "fade = RUN_IDLE_DECAY**idle_steps",
        "fade = 1.0",
        PLANNER,
    ),
    Mutant(
        "speculation-expects-the-optimistic-tokens",
        "ovbuild/runtime/speculation/planner.py",
        "plain = self.survival([s for s, _ in free], optimistic=False)",
        "plain = survival",
        PLANNER,
    ),
    Mutant(
        "scheduler-skipped-steps-not-idle",
        "ovbuild/runtime/draft_step.py",
        "request.acceptance.idle_steps += skipped",
        "pass",
        PLANNER,
    ),
    Mutant(
        "scheduler-idle-steps-never-fade",
        "ovbuild/runtime/draft_step.py",
        "request.acceptance.settle(IDLE_DECAY)",
        "request.acceptance.idle_steps = 0",
        PLANNER,
    ),
    Mutant(
        "drafter-full-block-always",
        "ovbuild/runtime/speculation/drafters/block.py",
        "block = min(self.block_size, item.num_tokens + self.candidate_offset) if item.anchor is not None else 0",
        "block = self.block_size if item.anchor is not None else 0",
        ("tests/test_drafter_proposals.py", *SPECULATIVE),
    ),
    Mutant(
        "sampling-race-multiplies",
        "ovbuild/runtime/decode/sampling.py",
        "score = np.divide(p, keys,",
        "score = np.multiply(p, keys,",
        SAMPLING,
    ),
    Mutant(
        "sampling-exact-verification-ignored",
        "ovbuild/runtime/decode/verify.py",
        'if q is None or not proposal or params.verification == "exact":',
        "if q is None or not proposal:",
        SAMPLING,
    ),
    Mutant(
        "sampling-accepts-when-p-above-q",
        "ovbuild/runtime/decode/verify.py",
        "if u[i].accept * q[i][x] >= p[i][x]:",
        "if q[i][x] >= p[i][x]:",
        SAMPLING,
    ),
    # -- how calls are bound and padded, and how skipped steps are counted ------------------------------------------
    Mutant(
        "binder-reused-buffer-not-written",
        "ovbuild/runtime/model/binding.py",
        "held[...] = value  # the bound tensor reads this memory at infer()",
        "pass",
        CALLS,
    ),
    Mutant(
        "binder-array-leaves-plain-values-noted",
        "ovbuild/runtime/model/binding.py",
        "            self._written.pop(i, None)\n",
        "            pass\n",
        CALLS,
    ),
    Mutant(
        "binder-plain-list-not-copied",
        "ovbuild/runtime/model/binding.py",
        "self._written[i] = list(value) if type(value) is list else value",
        "self._written[i] = value",
        CALLS,
    ),
    Mutant(
        "draft-precision-device-default-everywhere",
        "ovbuild/runtime/model/devices.py",
        'return None if "amx_bf16" in machine.cpu_flags() else "f32"',
        "return None",
        ("tests/test_runtime_validation.py",),
    ),
    Mutant(
        "padding-blocks-kept",
        "ovbuild/runtime/model/executors.py",
        "m.cache.allocator.free(PAD_SEQUENCE)",
        "pass",
        CALLS,
    ),
    Mutant(
        "padding-taps-not-cut",
        "ovbuild/runtime/model/paged_model.py",
        "outputs |= {name: outputs[name][:real] for name in ROW_OUTPUTS if name in outputs}",
        "pass",
        CALLS,
    ),
    Mutant(
        "scheduler-skips-lost-at-finish",
        "ovbuild/runtime/draft_step.py",
        "if request.metrics.first_token_time is not None:  # it decoded: its skipped steps are owed",
        "if False:",
        PLANNER,
    ),
    Mutant(
        "speculation-no-draft-margin",
        "ovbuild/runtime/speculation/planner.py",
        "rates[best] < DRAFT_MARGIN * rates[0]",
        "False",
        PLANNER,
    ),
    Mutant(
        "scheduler-batch-change-not-replanned",
        "ovbuild/runtime/draft_step.py",
        "self.skips_left = min(self.skips_left, REPLAN_AFTER_CHANGE)",
        "pass",
        PLANNER,
    ),
    Mutant(
        "speculation-run-estimate-never-refreshed",
        "ovbuild/runtime/speculation/planner.py",
        "            self._run_estimate = None\n",
        "",
        PLANNER,
    ),
    Mutant(
        "speculation-realism-ignored",
        "ovbuild/runtime/speculation/planner.py",
        "        realism = self.realism\n",
        "        realism = 1.0\n",
        PLANNER,
    ),
    # -- exact bf16 math -----------------------------------------------------------------------------------------------
    Mutant(
        "scheduler-verification-rows-in-one-subsequence",
        "ovbuild/runtime/verification.py",
        "one_per_row = generated and self.target.row_subsequences",
        "one_per_row = False",
        ("tests/test_speculative.py",),
    ),
    Mutant(
        "paged-taps-left-in-f32",
        "ovbuild/runtime/model/paged_model.py",
        'if TAPS not in names or device_kind(device) != "CPU":',
        "if True:",
        ("tests/test_paged_parity.py",),
    ),
    Mutant(
        "devices-bf16-target-with-states",
        "ovbuild/runtime/model/devices.py",
        "if on_cpu and not stateful and kv_cache_precision",
        "if on_cpu and kv_cache_precision",
        ("tests/test_runtime_validation.py",),
    ),
    # -- static row counts ---------------------------------------------------------------------------------------------
    Mutant(
        "demo-times-its-first-round",
        "ovbuild/demo.py",
        "for r in range(-1, rounds):",
        "for r in range(rounds):",
        ("tests/test_demo.py",),
    ),
    Mutant(
        "demo-compiles-copies-while-timing",
        "ovbuild/demo.py",
        "        pipeline.compile_copies()\n",
        "",
        ("tests/test_generate_cli.py",),
    ),
    Mutant(
        "static-rows-copy-compile-error-raw",
        "ovbuild/runtime/model/static_rows.py",
        "            except (RuntimeError, MemoryError) as e:\n",
        "            except ZeroDivisionError as e:\n",
        ("tests/test_static_rows.py",),
    ),
    Mutant(
        "static-rows-1-row-copies",
        "ovbuild/runtime/model/static_rows.py",
        "COPY_ROWS = (2, 3, 4,",
        "COPY_ROWS = (1, 2, 3, 4,",
        ("tests/test_static_rows.py",),
    ),
    Mutant(
        "static-rows-long-calls-all-dynamic",
        "ovbuild/runtime/model/static_rows.py",
        "    cut: list[tuple[list[int], bool]] = [(long, False)] if long else []\n",
        "    if long:\n        return [(list(range(len(rows))), False)]\n    cut: list[tuple[list[int], bool]] = []\n",
        ("tests/test_static_rows.py",),
    ),
    Mutant(
        "static-rows-merge-ignores-order",
        "ovbuild/runtime/model/static_rows.py",
        "                merged[name][held] = value",
        "                merged[name][np.sort(held)[::-1]] = value",
        ("tests/test_static_rows.py",),
    ),
    Mutant(
        "static-rows-copies-miss-compile-properties",
        "ovbuild/runtime/model/static_rows.py",
        "        self.config = {**compiled_properties(compiled, device), **config}",
        "        self.config = dict(config)",
        QUANTIZED,
    ),
    Mutant(
        "scheduler-target-cost-keeps-compiling-calls",
        "ovbuild/runtime/verification.py",
        "if self.speculation is not None and self.target.compile_s == compiled:",
        "if self.speculation is not None:",
        ("tests/test_static_rows.py",),
    ),
    # -- calls without taps and the catch-up ---------------------------------------------------------------------------
    Mutant(
        "catch-up-skips-the-partial-block-copy",
        "ovbuild/runtime/catch_up.py",
        "            if partial is not None:\n",
        "            if False:\n",
        UNTAPPED,
    ),
    Mutant(
        "catch-up-writes-the-requests-own-blocks",
        "ovbuild/runtime/catch_up.py",
        "            rows.append(SequenceRows(seq, start, end - start))",
        "            rows.append(SequenceRows(request.id, start, end - start))",
        UNTAPPED,
    ),
    Mutant(
        "fork-frees-borrowed-blocks",
        "ovbuild/runtime/cache/kv_cache.py",
        "self.share(seq_id, source_table[:whole])",
        "self.tables[seq_id] = source_table[:whole]",
        UNTAPPED,
    ),
    Mutant(
        "scheduler-takes-taps-after-a-gap",
        "ovbuild/runtime/verification.py",
        "        if taps is not None and request.gap == 0:\n            request.add_taps(taps[: accepted + 1])",
        "        if taps is not None:\n            request.add_taps(taps[: accepted + 1])",
        UNTAPPED,
    ),
    Mutant(
        "scheduler-drafts-without-catching-up",
        "ovbuild/runtime/draft_step.py",
        "        catch_up_s = self._catch_up(plan.catch_up, lengths)\n",
        "        catch_up_s = 0.0\n",
        UNTAPPED,
    ),
    Mutant(
        "untapped-sibling-on-its-own-cache",
        "ovbuild/runtime/model/paged_model.py",
        "        if cache_from is None:\n",
        "        if True:\n",
        UNTAPPED,
    ),
    Mutant(
        "copy-returns-the-padded-index-rows",
        "ovbuild/runtime/model/executors.py",
        "value if name in ROW_OUTPUTS else value[:named]",
        "value if name in ROW_OUTPUTS else value[-named:]",
        ("tests/test_static_rows.py",),
    ),
    Mutant(
        "dynamic-model-runs-1-row-calls-unpadded",
        "ovbuild/runtime/model/executors.py",
        "    return DynamicExecutor(model, MIN_ROWS if pinned else 1)\n",
        "    return DynamicExecutor(model, 1)\n",
        ("tests/test_static_rows.py",),
    ),
    Mutant(
        "untapped-sibling-for-any-size",
        "ovbuild/runtime/model/paged_model.py",
        "        small = weights <= MAX_WEIGHT_BYTES // 2\n",
        "        small = True\n",
        UNTAPPED,
    ),
    Mutant(
        "scheduler-leaves-taps-out-for-a-pinned-draft-length",
        "ovbuild/runtime/scheduler.py",
        "        if idle and not any(r.config.num_assistant_tokens for r in self.running):",
        "        if idle:",
        UNTAPPED,
    ),
    Mutant(
        "planner-ignores-gaps",
        "ovbuild/runtime/speculation/planner.py",
        "        gaps = gaps or [0] * len(free)\n",
        "        gaps = [0] * len(free)\n",
        PLANNER,
    ),
    Mutant(
        "planner-charges-a-catch-up-in-full",
        "ovbuild/runtime/speculation/planner.py",
        "self.target_cost(np.array(caught)), 0.0) / CATCH_UP_STEPS)",
        "self.target_cost(np.array(caught)), 0.0) / 1)",
        PLANNER,
    ),
    # -- narrow weights -------------------------------------------------------------------------------------------
    Mutant(
        "narrow-weights-never-marked",
        "ovbuild/runtime/model/narrow_weights.py",
        "    if not stored or not weight_converts(model, stored):",
        "    if True:",
        NARROW,
    ),
    Mutant(
        "narrow-weights-under-f32-math",
        "ovbuild/runtime/model/narrow_weights.py",
        "    return NARROW_FLOATS if too_big else ()",
        "    return NARROW_FLOATS",
        NARROW,
    ),
    Mutant(
        "narrow-weights-widened-however-short-of-memory",
        "ovbuild/runtime/model/narrow_weights.py",
        "    return NARROW_FLOATS if too_big else ()",
        "    return ()",
        NARROW,
    ),
    Mutant(
        "narrow-weights-of-any-float",
        "ovbuild/runtime/model/narrow_weights.py",
        "        return (MATH_TYPES[math],)",
        "        return NARROW_FLOATS",
        NARROW,
    ),
    Mutant(
        "narrow-weights-on-the-callers-model",
        "ovbuild/runtime/model/narrow_weights.py",
        "    copy = model.clone()\n",
        "    copy = model\n",
        NARROW,
    ),
    # -- mixture-of-experts MLP and the MiniCPM-V / DSpark layouts -----------------------------------------------------
    Mutant(
        "moe-routing-weights-not-renormalised",
        "ovbuild/graph/moe.py",
        "named(ops.divide(values, total), ",
        "named(values, ",
        MOE,
    ),
    Mutant(
        "moe-dense-gate-and-up-halves-swapped",
        "ovbuild/graph/moe.py",
        "    gate, up = (ops.squeeze(part, i64([2]))",
        "    up, gate = (ops.squeeze(part, i64([2]))",
        MOE,
    ),
    Mutant(
        "moe-shared-expert-ungated",
        "ovbuild/graph/moe.py",
        "ops.multiply(shared, shared_gate)",
        "ops.multiply(shared, ops.constant(np.float32(1)))",
        MOE,
    ),
    Mutant(
        "moe-per-expert-layout-up-before-gate",
        "ovbuild/weights/moe.py",
        'names = ("gate", "up") if part == "gate_up"',
        'names = ("up", "gate") if part == "gate_up"',
        MOE,
    ),
    Mutant(
        "dspark-nested-keys-ignored",
        "ovbuild/weights/families/dspark.py",
        "        return merged_key(r, nested, name)\n",
        "        return r\n",
        ("tests/test_minicpmv.py",),
    ),
    # -- Ray Serve affinity -----------------------------------------------------------------------------------------
    Mutant(
        "affinity-keys-not-chained",
        "ovbuild/serve/affinity.py",
        'chain = hashlib.blake2b(chain + b"\\x00" + block, digest_size=12).digest()',
        "chain = hashlib.blake2b(block, digest_size=12).digest()",
        AFFINITY,
    ),
    Mutant(
        "affinity-shortest-owned-prefix",
        "ovbuild/serve/affinity.py",
        "        for key in reversed(keys):",
        "        for key in keys:",
        AFFINITY,
    ),
    Mutant(
        "affinity-busy-owner-kept",
        "ovbuild/serve/affinity.py",
        "    return owner if loads[owner] <= min(loads.values()) + imbalance else None",
        "    return owner",
        AFFINITY,
    ),
    Mutant(
        "ray-router-ignores-affinity",
        "ovbuild/serve/ray_app.py",
        '        owner = pick(self.table.owner(kwargs.get("affinity") or []), loads, self.imbalance)',
        "        owner = None",
        ("tests/test_serve_ray.py",),
    ),
    # -- the demo's honesty and the kept calibration ------------------------------------------------------------------
    Mutant(
        "demo-shows-a-speed-up-where-the-planner-never-drafted",
        "ovbuild/demo.py",
        "    if not c.speculation_ran:\n",
        "    if False:\n",
        ("tests/test_demo.py",),
    ),
    Mutant(
        "calibration-cache-ignores-recalibrate",
        "ovbuild/runtime/speculation/calibration.py",
        "        if self.refresh:\n            return False\n",
        "",
        ("tests/test_calibration_cache.py",),
    ),
    Mutant(
        "calibration-cache-keyed-without-settings",
        "ovbuild/runtime/speculation/calibration.py",
        '        "settings": settings,\n',
        "",
        ("tests/test_calibration_cache.py",),
    ),
    # -- penalties and logprobs ---------------------------------------------------------------------------------------
    Mutant(
        "penalties-rows-ignore-earlier-draft-tokens",
        "ovbuild/runtime/decode/penalties.py",
        "self.generated + self.draft[:i])",
        "self.generated)",
        ("tests/test_penalties.py",),
    ),
    Mutant(
        "penalties-repetition-skips-the-prompt",
        "ovbuild/runtime/decode/penalties.py",
        "seen = np.union1d(prompt_seen, tokens) if prompt_seen is not None else tokens",
        "seen = tokens",
        ("tests/test_penalties.py",),
    ),
    Mutant(
        "logprobs-after-the-penalties",
        "ovbuild/runtime/commit.py",
        "    for i, (token, row) in enumerate(zip(tokens, logits, strict=False)):",
        "    rows = penalized(request, logits)\n"
        "    logits = logits if rows is None else np.stack([rows[i] for i in range(len(logits))])\n"
        "    for i, (token, row) in enumerate(zip(tokens, logits, strict=False)):",
        ("tests/test_logprobs.py",),
    ),
    Mutant(
        "prompt-logprobs-from-cached-prefix",
        "ovbuild/runtime/admission.py",
        "if not self.prefix_caching or request.config.prompt_logprobs is not None:\n            return 0, 0  # prompt",
        "if not self.prefix_caching:\n            return 0, 0  # prompt",
        ("tests/test_logprobs.py",),
    ),
)
