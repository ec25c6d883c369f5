"""Structured output from Python and the command line on the tiny pair: `LLM.generate(response_format=...)` with a
pydantic model or OpenAI's dict, `ovbuild generate --json-schema FILE` and `--regex`, and clean errors for a schema
file that is not JSON or a schema the engine refuses."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from pydantic import BaseModel

from ovbuild import LLM
from ovbuild.cli import main
from ovbuild.errors import GrammarError

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
    "required": ["id", "ok"],
    "additionalProperties": False,
}


class Item(BaseModel):
    id: int
    ok: bool


@pytest.fixture(scope="module")
def llm(tiny_pair):
    return LLM(*tiny_pair)


def test_llm_generate_with_a_pydantic_model_and_with_a_dict(llm):
    text = llm.generate("An item:", max_new_tokens=64, response_format=Item)
    Item.model_validate_json(text)
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}
    texts = llm.generate(["a", "b", "c"], max_new_tokens=64, response_format=fmt)
    for t in texts:
        jsonschema.validate(json.loads(t), SCHEMA)
    assert llm.generate("x", max_new_tokens=8, response_format={"type": "text"}) == llm.generate("x", max_new_tokens=8)


def test_llm_refuses_a_bad_schema_by_name(llm):
    with pytest.raises(GrammarError, match="strin"):
        llm.generate(
            "x", response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "strin"}}}
        )


def run_cli(tiny_pair, tmp_path, *extra) -> list[str]:
    out = tmp_path / "out.json"
    args = ["generate", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--max-new-tokens", "64"]
    assert main([*args, "--prompt", "a", "--prompt", "b", "--json", str(out), *extra]) == 0
    return [r["text"] for r in json.loads(out.read_text())["requests"]]


def test_cli_json_schema_and_regex(tiny_pair, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    for text in run_cli(tiny_pair, tmp_path, "--json-schema", str(schema)):
        jsonschema.validate(json.loads(text), SCHEMA)
    for text in run_cli(tiny_pair, tmp_path, "--regex", "[a-z]{2,5}[.]"):
        assert re.fullmatch("[a-z]{2,5}[.]", text), text


def test_cli_bad_schema_file_and_bad_regex_are_one_line_errors(tiny_pair, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    base = ["generate", "--target", str(tiny_pair[0]), "--prompt", "a"]
    assert main([*base, "--json-schema", str(bad)]) == 2
    assert f"--json-schema {bad}: not JSON" in capsys.readouterr().err
    assert main([*base, "--regex", "a("]) == 2
    assert "invalid regex" in capsys.readouterr().err
