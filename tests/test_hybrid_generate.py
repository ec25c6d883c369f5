"""`ovbuild generate` on an exported tiny hybrid pair: the same tokens with the draft as without, at the CLI's default
precisions, with a pinned and an adaptive draft length."""

from __future__ import annotations

import json

import pytest

from ovbuild.cli import main
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_dflash, write_tiny_hybrid_target

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(target folder, draft folder) as `ovbuild export` writes them."""
    root = tmp_path_factory.mktemp("hybrid_cli")
    target, draft = write_tiny_hybrid_target(root / "ct"), write_tiny_hybrid_dflash(root / "cd")
    common = ["--weight-format", "keep", "--quiet"]
    assert main(["export", "-m", str(target), str(root / "t"), "--draft-of", str(draft), *common]) == 0
    assert main(["export", "-m", str(draft), str(root / "d"), "--target-model", str(target), *common]) == 0
    return root / "t", root / "d"


def generate(exported, out, *extra) -> dict:
    target, _ = exported
    prompts = ["def add(a, b):", "import os\n", "The quick brown fox"]
    args = ["generate", "--target", str(target), "--max-new-tokens", "16", "--json", str(out), *extra]
    assert main(args + [a for p in prompts for a in ("--prompt", p)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("k", ["3", None])
def test_generate_with_and_without_the_draft_gives_the_same_tokens(exported, tmp_path, k):
    alone = generate(exported, tmp_path / "alone.json")
    pinned = ["--num-assistant-tokens", k] if k else []
    spec = generate(exported, tmp_path / "spec.json", "--draft", str(exported[1]), *pinned)
    ids = [r["generated_ids"] for r in alone["requests"]]
    assert [r["generated_ids"] for r in spec["requests"]] == ids
    assert all(len(i) == 16 for i in ids)
    assert spec["totals"]["num_draft_tokens"] > 0
