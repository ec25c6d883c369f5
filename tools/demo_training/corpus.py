"""The corpus (Python stdlib sources, held-out split) and its byte-level BPE tokenizer: the ``tokenizer`` stage."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np

from .common import EOS, MASK, log, write_json

EXCLUDED_DIRS = {
    "test", "tests", "idlelib", "lib2to3", "site-packages", "encodings", "pydoc_data", "ensurepip", "turtledemo",
    "__phello__", "__pycache__",
}  # fmt: skip


def corpus_files() -> list[tuple[str, Path]]:
    """(relative path, path) of every stdlib ``*.py`` file kept in the corpus, in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(p in EXCLUDED_DIRS or p.startswith("config-") for p in rel.parts[:-1]):
            continue
        if rel.name.startswith("_sysconfigdata"):
            continue
        files.append((rel.as_posix(), path))
    return files


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 100 < 5


def read_corpus() -> tuple[list[str], dict[str, str]]:
    """Training texts and held-out texts (by relative path)."""
    train, heldout = [], {}
    for rel, path in corpus_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        if is_heldout(rel):
            heldout[rel] = text
        else:
            train.append(text)
    return train, heldout


# -------------------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, MASK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def save_tokenizer(tok, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
    }
    write_json(out / "tokenizer_config.json", config)


def load_tokenizer(path: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path / "tokenizer.json"))


def encode_stream(tok, texts: list[str]) -> np.ndarray:
    """All texts as one uint16 stream, each followed by eos."""
    eos = tok.token_to_id(EOS)
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def stage_tokenizer(args) -> None:
    train, heldout = read_corpus()
    log(f"corpus: {len(train)} training files ({sum(map(len, train)) / 1e6:.1f} MB), {len(heldout)} held out")
    tok = train_tokenizer(train, args.vocab)
    save_tokenizer(tok, args.out / "target")
    train_ids, heldout_ids = encode_stream(tok, train), encode_stream(tok, list(heldout.values()))
    np.save(args.work / "train_tokens.npy", train_ids)
    np.save(args.work / "heldout_tokens.npy", heldout_ids)
    write_json(args.work / "heldout_files.json", sorted(heldout))
    chars = sum(map(len, train))
    log(f"tokenizer: vocab {tok.get_vocab_size()}, mask id {tok.token_to_id(MASK)}, eos id {tok.token_to_id(EOS)}")
    log(f"tokens: train {len(train_ids)} ({chars / len(train_ids):.2f} chars/token), held out {len(heldout_ids)}")
