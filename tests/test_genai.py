"""GenAI form: the stateful SDPA IRs against the numpy reference, their GenAI contract, and stock openvino-genai runs.

Every IR here is compiled with INFERENCE_PRECISION_HINT=f32: this machine's CPU has bf16 units, so OpenVINO (and
GenAI, which passes its properties on) would otherwise run in bf16 and the parity bound of f32 weights would not hold.
"""

from __future__ import annotations

import json

import numpy as np
import openvino as ov
import openvino.opset16 as ops
import openvino_genai as genai
import pytest
from openvino._offline_transformations import paged_attention_transformation
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from ovbuild.errors import UnsupportedError
from ovbuild.export import export
from ovbuild.export.tokenizer import SpecialTokens, convert_tokenizer
from ovbuild.families import load_draft
from ovbuild.graph.genai.draft import build_genai_draft
from ovbuild.graph.genai.target import build_genai_target
from ovbuild.ir import MODEL_FILE, core
from ovbuild.ir.records import LOCATORS_KEY
from ovbuild.reference.dflash import DFlashReference
from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.targets import load_target
from ovbuild.testing import F32_NMSE, nmse, write_tiny_dflash, write_tiny_target
from ovbuild.testing.tokenizer import byte_level_tokenizer
from ovbuild.weights.checkpoint import Checkpoint

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

F32 = {"INFERENCE_PRECISION_HINT": "f32"}
TAPS = (1, 3, 5)
PROMPT = [5, 17, 42, 99, 7, 100, 3]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_target, tiny_draft):
    """The tiny target and draft written once as GenAI folders."""
    out = tmp_path_factory.mktemp("genai")
    target = export(tiny_target, out / "target", format="genai", weight_format="keep", quiet=True).out
    draft = export(tiny_draft, out / "draft", format="genai", weight_format="keep", quiet=True).out
    return target, draft


def read(folder) -> ov.Model:
    return core().read_model(str(folder / MODEL_FILE))


def run_target(request: ov.InferRequest, chunks: list[list[int]]) -> list[dict[str, np.ndarray]]:
    """Prefill then decode, as a stateful pipeline does: each call sends only its new tokens."""
    request.reset_state()
    past, outputs = 0, []
    for ids in chunks:
        n = len(ids)
        request.infer(
            {
                "input_ids": np.array([ids], np.int64),
                "attention_mask": np.ones((1, past + n), np.int64),
                "position_ids": np.arange(past, past + n, dtype=np.int64)[None],
                "beam_idx": np.zeros(1, np.int32),
            }
        )
        outputs.append({o.get_any_name(): request.get_tensor(o).data[0].copy() for o in request.model_outputs})
        past += n
    return outputs


def test_target_matches_reference_over_prefill_and_decode(folders, target):
    cfg, weights = target
    model = read(folders[0])
    # Expose the nodes GenAI's locators point at for the draft's taps, to check them against the reference's taps.
    producers = json.loads(model.get_rt_info(LOCATORS_KEY.path).astype(str))["layers"]
    nodes = {n.get_friendly_name(): n for n in model.get_ops()}
    for i in TAPS:
        r = ops.result(nodes[producers[str(i)]["producer"]].output(producers[str(i)]["output_index"]))
        r.output(0).set_names({f"tap.{i}"})
        model.add_results([r])
    request = core().compile_model(model, "CPU", F32).create_infer_request()
    rng = np.random.default_rng(3)
    chunks = [rng.integers(0, 256, 9).tolist(), [11], [12], rng.integers(0, 256, 4).tolist(), [13], [14]]
    ir = run_target(request, chunks)
    ref = Qwen3Reference(cfg, weights)
    cache = ref.new_cache()
    expected = [ref.forward(cache, np.array(ids), TAPS) for ids in chunks]
    logits = nmse(np.concatenate([o["logits"] for o in ir]), np.concatenate([e[0] for e in expected]))
    taps = nmse(
        np.concatenate([np.concatenate([o[f"tap.{i}"] for i in TAPS], -1) for o in ir]),
        np.concatenate([e[1] for e in expected]),
    )
    print(f"genai target, prefill 9 + 5 calls: logits NMSE {logits:.2e}, located taps NMSE {taps:.2e}")
    assert logits < F32_NMSE, f"target logits NMSE {logits:.2e}"
    assert taps < F32_NMSE, f"hidden states at the located producers NMSE {taps:.2e}"


def run_draft(request: ov.InferRequest, ref: DFlashReference, embed: np.ndarray, steps, seed: int = 0):
    """GenAI's DFlash calls: new context taps + [seed, mask x N] embeddings at positions after the committed ones."""
    cfg, rng = ref.cfg, np.random.default_rng(seed)
    request.reset_state()
    cache, committed, ir, expected = ref.new_cache(), 0, [], []
    for n_ctx, n_block in steps:
        taps = rng.standard_normal((n_ctx, cfg.num_taps * cfg.target_hidden_size)).astype(np.float32)
        block = np.array([int(rng.integers(0, 256))] + [cfg.mask_token_id] * (n_block - 1))
        rows = n_ctx + n_block
        request.infer(
            {
                "inputs_embeds": embed[block][None],
                "hidden_states": taps[None],
                "position_ids": np.arange(committed, committed + rows, dtype=np.int64)[None],
                "attention_mask": np.ones((1, committed + rows), np.int64),
            }
        )
        ir.append(request.get_tensor("last_hidden_state").data[0].copy())
        expected.append(ref.forward(cache, taps.astype(np.float64), block)[1])
        committed += n_ctx
    return np.concatenate(ir), np.concatenate(expected)


# (context rows, block rows): a prompt-sized first context, then seed + accepted deltas, blocks of varying length.
DRAFT_STEPS = [(9, 6), (1, 6), (4, 6), (2, 3), (6, 8), (1, 2)]


def test_draft_matches_reference_over_context_and_block_steps(folders, target, draft):
    dcfg, dweights = draft
    request = core().compile_model(read(folders[1]), "CPU", F32).create_infer_request()
    embed = target[1].get("embed_tokens").to_f32()
    ir, expected = run_draft(request, DFlashReference(dcfg, dweights, target[1]), embed, DRAFT_STEPS)
    err = nmse(ir, expected)
    print(f"genai draft, {len(DRAFT_STEPS)} steps: last_hidden_state NMSE {err:.2e}")
    assert ir.shape == expected.shape == (sum(q - 1 for _, q in DRAFT_STEPS), dcfg.hidden_size)
    assert err < F32_NMSE, f"draft last_hidden_state NMSE {err:.2e}"


def test_sliding_window_draft_matches_reference(tmp_path, target):
    """A causal sliding layer with a window below the block, then a bidirectional full layer."""
    d = load_draft(
        Checkpoint.open(
            write_tiny_dflash(
                tmp_path / "d",
                layer_types=["sliding_attention", "full_attention"],
                use_sliding_window=True,
                sliding_window=4,
            )
        )
    )
    assert d[0].sliding_windows == (4, 0) and d[0].layer_causal == (True, False)
    request = core().compile_model(build_genai_draft(*d), "CPU", F32).create_infer_request()
    embed = target[1].get("embed_tokens").to_f32()
    ir, expected = run_draft(request, DFlashReference(d[0], d[1], target[1]), embed, DRAFT_STEPS, seed=1)
    err = nmse(ir, expected)
    print(f"genai draft with a window of 4: last_hidden_state NMSE {err:.2e}")
    assert err < F32_NMSE, f"windowed draft NMSE {err:.2e}"


def test_bidirectional_window_below_the_block_matches_reference(tmp_path, target):
    """Bidirectional sliding layers with a window (3) below the blocks (up to 8): the mask windows both directions."""
    d = load_draft(
        Checkpoint.open(
            write_tiny_dflash(
                tmp_path / "d",
                layer_types=["sliding_attention"] * 2,
                use_sliding_window=True,
                sliding_window=3,
                is_causal=False,
            )
        )
    )
    assert d[0].sliding_windows == (3, 3) and d[0].layer_causal == (False, False)
    request = core().compile_model(build_genai_draft(*d), "CPU", F32).create_infer_request()
    embed = target[1].get("embed_tokens").to_f32()
    ir, expected = run_draft(request, DFlashReference(d[0], d[1], target[1]), embed, DRAFT_STEPS, seed=2)
    err = nmse(ir, expected)
    print(f"genai draft, bidirectional window 3: last_hidden_state NMSE {err:.2e}")
    assert err < 1e-6, f"windowed draft NMSE {err:.2e}"


def test_sliding_window_target_is_refused(tmp_path):
    t = load_target(
        Checkpoint.open(
            write_tiny_target(
                tmp_path / "t",
                layer_types=["sliding_attention", "full_attention"] * 3,
                use_sliding_window=True,
                sliding_window=6,
            )
        )
    )
    with pytest.raises(UnsupportedError, match=r"target layers \[0, 2, 4\] use a sliding window"):
        build_genai_target(*t)


def test_draft_ir_follows_the_genai_contract(folders, draft):
    cfg = draft[0]
    model = read(folders[1])
    inputs = {p.get_any_name(): (p.get_element_type(), p.get_partial_shape()) for p in model.inputs}
    assert inputs == {
        "inputs_embeds": (ov.Type.f32, ov.PartialShape([-1, -1, cfg.hidden_size])),
        "hidden_states": (ov.Type.f32, ov.PartialShape([-1, -1, 3 * cfg.target_hidden_size])),
        "position_ids": (ov.Type.i64, ov.PartialShape([-1, -1])),
        "attention_mask": (ov.Type.i64, ov.PartialShape([-1, -1])),
    }
    assert [o.get_any_name() for o in model.outputs] == ["last_hidden_state"]
    assert model.get_rt_info("dflash_mode").astype(str) == "True"
    assert model.get_rt_info(["dflash", "mask_token_id"]).astype(str) == str(cfg.mask_token_id)
    assert model.get_rt_info(["dflash", "target_layer_ids"]).astype(str) == "1,3,5"
    # Context-only K/V state: one key and one value variable per layer, and no vocabulary-sized weight.
    assert len(model.get_variables()) == 2 * cfg.num_layers
    shapes = [tuple(n.get_output_shape(0)) for n in model.get_ops() if n.get_type_name() == "Constant"]
    assert not any(cfg.vocab_size in s for s in shapes), "the draft IR carries an embedding or lm_head"


def test_target_converts_to_paged_attention_as_genai_does(folders, target):
    """GenAI runs this conversion on load; every layer must become PagedAttention with no state left over."""
    cfg = target[0]
    model = read(folders[0])
    assert model.output(0).get_node().input_value(0).get_node().get_type_name() == "MatMul"  # logits <- lm_head
    paged_attention_transformation(model)
    kinds = [n.get_type_name() for n in model.get_ops()]
    assert kinds.count("PagedAttentionExtension") == cfg.num_layers
    assert "ReadValue" not in kinds and "Assign" not in kinds
    names = {p.get_any_name() for p in model.inputs}
    assert {"input_ids", "position_ids", "key_cache.0", "value_cache.0"} <= names
    assert not names & {"beam_idx", "attention_mask"}


def test_tokenizer_irs_match_tokenizers(folders):
    compiled = [
        core().compile_model(str(folders[0] / f), "CPU") for f in ("openvino_tokenizer.xml", "openvino_detokenizer.xml")
    ]
    reference = byte_level_tokenizer()
    for text in ["hello world", "héllo wörld ✓<|endoftext|> tail", "<|mask|><|mask|>x", "  spaces\tand\nlines "]:
        ids = compiled[0]([text])["input_ids"][0].tolist()
        assert ids == reference.encode(text).ids, text
        decoded = compiled[1](np.array([ids], np.int64))[0][0]
        assert decoded == reference.decode(ids), text


# Qwen2/Qwen3's tokenizer.json split pattern (case-insensitive contractions, a negative lookahead).
QWEN_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def qwen_style_tokenizer() -> Tokenizer:
    """A byte-level BPE laid out like Qwen3's (NFC, Split regex + ByteLevel, merges), trained offline on a few lines."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "The quick brown fox jumps over the lazy dog. It's 2026; numbers 12345 and café, naïve, Straße!",
        "def f(x):\n    return x ** 2\n\n",
        "Привет мир, 你好世界 🙂",
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus * 3, trainer)
    return tok


def test_qwen_style_tokenizer_converts_without_transformers(tmp_path):
    reference = qwen_style_tokenizer()
    reference.save(str(tmp_path / "tokenizer.json"))
    models_ = convert_tokenizer(tmp_path / "tokenizer.json", SpecialTokens(eos_token_id=0, pad_token_id=0))
    encode, decode = (core().compile_model(m, "CPU") for m in models_)
    texts = [
        "The lazy fox's café costs 12345 €.",
        "  def g(y):\n\treturn y\n\n\nend  ",
        "Привет, 你好 🙂 Straße<|endoftext|>x",
        "e\u0301 is NFC-composed",
    ]
    for text in texts:
        ids = encode([text])["input_ids"][0].tolist()
        assert ids == reference.encode(text).ids, text
        assert decode(np.array([ids], np.int64))[0][0] == reference.decode(ids), text


def test_unsupported_tokenizer_is_refused(tmp_path):
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(UnsupportedError, match=r"model\.type 'WordLevel'"):
        convert_tokenizer(tmp_path / "tokenizer.json", SpecialTokens(eos_token_id=0, pad_token_id=0))


def reference_greedy(cfg_weights, prompt: list[int], n: int) -> list[int]:
    ref = Qwen3Reference(*cfg_weights)
    cache, tokens = ref.new_cache(), []
    logits, _ = ref.forward(cache, np.array(prompt))
    for _ in range(n):
        tokens.append(int(logits[-1].argmax()))
        logits, _ = ref.forward(cache, np.array(tokens[-1:]))
    return tokens


def test_genai_dflash_matches_target_alone_reference_and_ovbuild(folders, target, tiny_target, tiny_draft, tmp_path):
    target_dir, draft_dir = folders
    # f32 inference and an f32 KV cache in both pipelines: GenAI's CPU defaults (bf16 compute, u8 cache) would let
    # greedy tokens drift from the float64 reference through rounding alone.
    props = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}

    def scheduler():
        # GenAI's default LLMPipeline scheduler enables prefix caching, which its DFlash pipeline refuses.
        s = genai.SchedulerConfig()
        s.enable_prefix_caching, s.cache_size = False, 1
        return s

    config = genai.GenerationConfig()
    config.max_new_tokens, config.ignore_eos = 24, True
    prompt = ov.Tensor(np.array([PROMPT], np.int64))
    alone = genai.LLMPipeline(str(target_dir), "CPU", scheduler_config=scheduler(), **props)
    plain = list(alone.generate(prompt, config).tokens[0])
    draft = genai.draft_model(str(draft_dir), "CPU", INFERENCE_PRECISION_HINT="f32")
    pipe = genai.LLMPipeline(str(target_dir), "CPU", draft_model=draft, scheduler_config=scheduler(), **props)
    config.num_assistant_tokens = 5
    result = pipe.generate(prompt, config)
    speculative = list(result.tokens[0])
    expected = reference_greedy(target, PROMPT, 24)
    draft_calls = len(result.extended_perf_metrics.draft_model_metrics.raw_metrics.m_durations)
    print(f"GenAI DFlash: {draft_calls} draft calls, {result.extended_perf_metrics.get_num_accepted_tokens()} accepted")
    assert draft_calls > 0, "the draft never ran"
    assert speculative == plain, f"DFlash {speculative} != target alone {plain}"
    assert speculative == expected, f"DFlash {speculative} != numpy reference {expected}"
    ours = ovbuild_runtime_tokens(tiny_target, tiny_draft, tmp_path, 24)
    assert speculative == ours, f"GenAI {speculative} != ovbuild's own runtime {ours}"
    # The folder's tokenizer IRs are what LLMPipeline uses for text.
    assert alone.get_tokenizer().encode("héllo").input_ids.data.tolist() == [byte_level_tokenizer().encode("héllo").ids]


def ovbuild_runtime_tokens(tiny_target, tiny_draft, out, n: int) -> list[int]:
    """The same prompt through ovbuild's paged export and its own speculative runtime (exact defaults)."""
    from ovbuild.runtime.pipeline import Pipeline
    from ovbuild.runtime.request import GenerationConfig

    target = export(tiny_target, out / "target", draft_of=tiny_draft, weight_format="keep", quiet=True).out
    draft = export(tiny_draft, out / "draft", target_model=tiny_target, weight_format="keep", quiet=True).out
    scheduler = Pipeline(target, draft).scheduler()
    request = scheduler.add_request(PROMPT, GenerationConfig(max_new_tokens=n, num_assistant_tokens=5))
    scheduler.run()
    return request.generated
