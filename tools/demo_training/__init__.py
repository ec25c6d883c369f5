"""Train the ovbuild demo pair: a small Qwen3 target and a DFlash v1 draft for it, on Python stdlib code.

Development tool only. It needs torch (the ``train`` extra: ``pip install -e .[train]``); the ovbuild package and its
tests never import torch. The checkpoints it writes follow the Hugging Face layout (bf16 safetensors) and the formulas
written out in ``docs/formulas.md`` (building blocks, Qwen3 target with taps, DFlash v1 draft step, the speculative
step), so an independent numpy/OpenVINO implementation can run them.

Stages (each re-runnable on its own; later stages read what earlier ones wrote):

* ``tokenizer``: the corpus is the ``*.py`` source of this interpreter's standard library (tests, idlelib, lib2to3,
  encodings, pydoc_data and a few other repetitive folders left out), in sorted path order; a file is held out when
  the SHA-256 of its relative path is 0..4 mod 100 (about 5 %). A byte-level BPE tokenizer is trained on the
  training files, with ``<|endoftext|>`` (eos = bos = pad) and ``<|mask|>`` (the DFlash mask token, never fed to
  the target). Token streams go to the work directory, never into the repository.
* ``target``: next-token training of a Qwen3 dense decoder (plain torch, tied embeddings) on random 256-token
  windows, AdamW, warmup + cosine; written bf16 to ``<out>/target``.
* ``distill``: the target's greedy continuations of prompts sampled from the training stream, plus its tapped
  hidden states (outputs of ``target_layer_ids``) for every position; stored in the work directory.
* ``draft``: a 2-layer DFlash v1 draft trained on those continuations, many anchors per sequence in one pass with
  a block-sparse mask, each anchor with a block length drawn from 2..block_size (runtimes draft
  num_assistant_tokens + 1 rows), cross-entropy against the target's greedy tokens, row j weighted exp(-(j-1)/4);
  written bf16 to ``<out>/draft`` (no embed_tokens, no lm_head: the draft uses the target's).
* ``eval``: greedy speculative decoding (docs/formulas.md, "The speculative step") on held-out prompts, in float64
  from the shipped bf16 weights; reports acceptance per num_assistant_tokens and asserts it reproduces plain greedy
  decoding.

``--check`` runs the equivalence checks alone: cached target decoding equals the full forward, and the batched
training-time draft forward equals a direct one-block implementation of the DFlash v1 draft step (docs/formulas.md)
for every anchor. The ``draft`` stage runs the same checks on the real target before training.

Modules, in the order the stages use them: ``common`` (special tokens, log, JSON), ``corpus`` (corpus, tokenizer,
``tokenizer`` stage), ``checkpoints`` (HF configs, safetensors), ``train`` (lr schedule, optimizer, loop),
``train_target`` (``target``), ``distill`` (``distill``), ``draft`` (batched training forward and one-block reference),
``checks`` (``--check``), ``train_draft`` (``draft``), ``evaluate`` (``eval``) and ``cli`` (arguments, stage order),
which ``tools/train_demo.py`` runs.
"""
