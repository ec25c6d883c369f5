"""The prefix-affinity keys and table of the Ray Serve router, the per-replica /metrics merge, and the checks of
`ovbuild serve --replicas` made before Ray starts (no Ray needed), and the parser flags reaching every replica."""

from __future__ import annotations

import pytest

from ovbuild.cli import main
from ovbuild.serve.affinity import AffinityConfig, AffinityTable, block_keys, pick, request_prefix
from ovbuild.serve.metrics import ServeMetrics
from ovbuild.serve.ray_metrics import labelled

CONFIG = AffinityConfig(block_tokens=4, chars_per_token=2, max_blocks=3)  # text blocks of 8 characters


def test_prompts_sharing_whole_blocks_share_exactly_those_keys():
    a, b = block_keys("0123456789abcdefXYZ", CONFIG), block_keys("0123456789abcdeQ", CONFIG)
    assert len(a) == 2 and len(b) == 2  # the partial third block of `a` gets no key
    assert a[0] == b[0] and a[1] != b[1]  # the second block differs in its last character
    # a key stands for all the blocks before it too: an equal second block after a different first is another key
    assert block_keys("AAAAAAAA12345678", CONFIG)[1] != block_keys("BBBBBBBB12345678", CONFIG)[1]
    assert block_keys("0123456", CONFIG) == []  # shorter than a block: nothing a prefix cache could hold
    assert len(block_keys("x" * 100, CONFIG)) == CONFIG.max_blocks
    tokens = list(range(10))
    assert block_keys(tokens, CONFIG) == block_keys([*tokens[:8], 99], CONFIG)  # token blocks of 4 ids
    assert block_keys(tokens, CONFIG)[1] != block_keys([*tokens[:7], 99], CONFIG)[1]


def test_a_conversation_keeps_its_first_turns_keys():
    first = [{"role": "system", "content": "s" * 20}, {"role": "user", "content": "hello"}]
    later = [*first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    k1 = block_keys(request_prefix("/v1/chat/completions", {"messages": first}), CONFIG)
    k2 = block_keys(request_prefix("/v1/chat/completions", {"messages": later}), CONFIG)
    assert k1 and k2[: len(k1)] == k1
    assert request_prefix("/v1/completions", {"prompt": ["abc", "def"]}) == "abc"
    assert request_prefix("/v1/completions", {"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert request_prefix("/v1/completions", {"prompt": 5}) is None
    assert request_prefix("/v1/models", {}) is None


def test_the_table_routes_to_the_longest_owned_prefix_and_forgets_lost_replicas():
    table = AffinityTable(max_keys=4)
    table.assign(["a"], "r1")
    table.assign(["a", "b"], "r2")  # "a" stays r1's; "b" is new, r2's
    assert table.owner(["a", "b", "c"]) == "r2"
    assert table.owner(["a", "x"]) == "r1"
    assert table.owner(["x"]) is None
    table.keep_only({"r1"})
    assert table.owner(["a", "b"]) == "r1"
    table.assign(["c", "d", "e", "f"], "r1")
    assert len(table) == 4 and table.owner(["a"]) is None  # least recently used first out


def test_a_busy_owner_is_passed_over_for_the_least_loaded():
    assert pick("r1", {"r1": 3, "r2": 0}, imbalance=3) == "r1"
    assert pick("r1", {"r1": 4, "r2": 0}, imbalance=3) is None
    assert pick("gone", {"r1": 0}, imbalance=3) is None
    assert pick(None, {"r1": 0}, imbalance=3) is None


def test_metrics_of_replicas_merge_with_a_replica_label():
    a, b = ServeMetrics(), ServeMetrics()
    a.success.labels("stop").inc(3)
    b.generation_tokens.inc(5)
    text = labelled({"r1": a.exposition()[0], "r2": b.exposition()[0]}).decode()
    assert 'ovbuild_request_success_total{finished_reason="stop",replica="r1"} 3.0' in text
    assert 'ovbuild_generation_tokens_total{replica="r2"} 5.0' in text
    assert 'ovbuild_generation_tokens_total{replica="r1"} 0.0' in text
    assert text.count("# TYPE ovbuild_generation_tokens_total counter") == 1


@pytest.mark.parametrize(
    ("extra", "named"),
    [(["--replicas", "0"], "--replicas"), (["--replicas", "2", "--replica-cpus", "0"], "--replica-cpus")],
)
def test_serve_replicas_options_are_refused_before_ray_starts(tmp_path, capsys, extra, named):
    assert main(["serve", "--target", str(tmp_path), *extra]) == 2
    assert named in capsys.readouterr().err


def test_serve_replicas_names_a_missing_folder(tmp_path, capsys):
    assert main(["serve", "--target", str(tmp_path / "nope"), "--replicas", "2"]) == 2
    assert f"--target {tmp_path / 'nope'}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "parsers"),
    [
        ([], {"reasoning_parser": None, "tool_call_parser": "hermes"}),
        (["--reasoning-parser", "qwen3"], {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}),
    ],
)
def test_serve_replicas_pass_the_parsers_to_every_replica(tmp_path, capsys, monkeypatch, flags, parsers):
    """The parser flags reach the Ray application's builder (which binds them to each replica's app); Ray itself
    is not started: `start` fails as a replica that cannot start would."""
    pytest.importorskip("ray", reason="the Ray application needs the ray extra: pip install 'ovbuild[ray]'")
    import ovbuild.serve.ray_app as ray_app

    seen = {}

    def build(*args, **kwargs):
        seen.update(kwargs)
        return "app"

    def start(app, host, port, address):
        raise RuntimeError("not started in this test")

    monkeypatch.setattr(ray_app, "build_ray_app", build)
    monkeypatch.setattr(ray_app, "start", start)
    assert main(["serve", "--target", str(tmp_path), "--replicas", "2", *flags]) == 2
    assert "the replicas did not start: not started in this test" in capsys.readouterr().err
    assert seen == parsers


def test_each_replica_builds_its_app_with_the_parsers(monkeypatch):
    """EngineReplica hands the parsers to build_app, as the single-process server does."""
    pytest.importorskip("ray", reason="the Ray application needs the ray extra: pip install 'ovbuild[ray]'")
    import types

    import ovbuild.serve.ray_app as ray_app
    import ovbuild.serve.server as server

    seen = {}
    engine = types.SimpleNamespace(start=lambda: None)

    def build_app(*args, **kwargs):
        seen.update(kwargs)
        return types.SimpleNamespace(state=types.SimpleNamespace(engine=engine))

    context = types.SimpleNamespace(replica_id=types.SimpleNamespace(unique_id="r0"))
    monkeypatch.setattr(server, "build_app", build_app)
    monkeypatch.setattr(ray_app.serve, "get_replica_context", lambda: context)
    replica = ray_app.EngineReplica(
        "t", None, None, "m", 4, 16, None, reasoning_parser="qwen3", tool_call_parser="hermes"
    )
    assert seen == {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"} and replica.id == "r0"
