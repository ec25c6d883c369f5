"""The planner's calibration is kept per pair and machine and reused: a second pipeline over the same pair times no
calls, plans from the same costs and produces the same tokens; --recalibrate times again; a damaged or foreign entry
is timed again, never an error."""

from __future__ import annotations

import json

import pytest

from ovbuild.cli import main
from ovbuild.demo import export_pair
from ovbuild.runtime.pipeline import Pipeline, RuntimeOptions
from ovbuild.runtime.speculation import calibration
from ovbuild.runtime.speculation.calibration import (
    CALIBRATION_ROWS,
    CalibrationCache,
    calibration_key,
    folder_identity,
)
from ovbuild.runtime.speculation.call_cost import BUCKETS

PROMPTS = [list(range(3, 40)), list(range(50, 70))]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_target, tiny_draft):
    return export_pair(tiny_target, tiny_draft, tmp_path_factory.mktemp("pair"))


def entries(cache_dir) -> list:
    return sorted((cache_dir / "calibration").glob("*.json"))


def costs(pipeline: Pipeline) -> list[list[float]]:
    """The planner's predicted call seconds at every bucket, target and draft."""
    spec = pipeline.speculation
    return [spec.target_cost(BUCKETS).tolist(), spec.draft_cost(BUCKETS).tolist()]


def test_a_second_pipeline_reuses_the_calibration_and_plans_from_the_same_costs(folders, tmp_path, monkeypatch):
    monkeypatch.setenv("OVBUILD_CACHE_DIR", str(tmp_path))
    first = Pipeline(*folders)
    out1, m1 = first.generate(PROMPTS, 8)
    assert m1.calibration_s > 0 and first.speculation.calibrated
    [entry] = entries(tmp_path)
    stored = json.loads(entry.read_text())
    assert [rows for rows, _ in stored["target"]] == list(CALIBRATION_ROWS) == [rows for rows, _ in stored["draft"]]
    assert all(seconds > 0 for name in ("target", "draft") for _, seconds in stored[name])

    # the staleness check times two calls against the entry: on a busy machine tiny calls vary more than 1.5x
    monkeypatch.setattr(calibration, "STALE_FACTOR", 1e9)
    second = Pipeline(*folders)
    calls = []
    monkeypatch.setattr(calibration, "observe_calls", lambda *a: calls.append(a))  # must not be reached
    seeded = []
    real_plan = second.speculation.plan

    def plan(*args, **kwargs):
        if not seeded:  # the first plan's costs: the stored timings, exactly as a calibration leaves them
            seeded.append(costs(second))
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(second.speculation, "plan", plan)
    out2, m2 = second.generate(PROMPTS, 8)
    assert calls == [] and m2.calibration_s < m1.calibration_s / 2  # 4 timed calls, not 72
    assert [r.generated for r in out2] == [r.generated for r in out1]
    fresh = Pipeline(*folders)  # what a calibration with the stored times gives
    for name, cost in (("target", fresh.speculation.target_cost), ("draft", fresh.speculation.draft_cost)):
        for rows, seconds in stored[name]:
            cost.observe(rows, seconds)
    assert seeded == [costs(fresh)]


def test_recalibrate_times_again_and_replaces_the_entry(folders, tmp_path, monkeypatch):
    monkeypatch.setenv("OVBUILD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibration, "STALE_FACTOR", 1e9)  # the entry passes its check: only recalibrate refuses it
    Pipeline(*folders).generate(PROMPTS, 4)
    [entry] = entries(tmp_path)
    marked = {name: [[r, 1.0 + r] for r in CALIBRATION_ROWS] for name in ("target", "draft")}  # valid, and known
    entry.write_text(json.dumps(marked))
    again = Pipeline(*folders, RuntimeOptions(recalibrate=True))
    timed_again, real = [], calibration.observe_calls
    monkeypatch.setattr(calibration, "observe_calls", lambda *a: (timed_again.append(True), real(*a)))
    _, m = again.generate(PROMPTS, 4)
    assert timed_again == [True] and m.calibration_s > 0
    stored = json.loads(entry.read_text())
    assert len(stored["draft"]) == len(CALIBRATION_ROWS) and all(s < 1.0 for _, s in stored["target"])
    assert again.speculation.target_cost(1) < 1.0  # the marked times never reached the planner


def test_a_stale_entry_is_timed_again(folders, tmp_path, monkeypatch):
    """An entry whose times are far from what the models take now (a calibration on a busy machine) is replaced."""
    monkeypatch.setenv("OVBUILD_CACHE_DIR", str(tmp_path))
    Pipeline(*folders).generate(PROMPTS, 4)
    [entry] = entries(tmp_path)
    stored = json.loads(entry.read_text())
    slow = {name: [[rows, seconds * 1000] for rows, seconds in stored[name]] for name in ("target", "draft")}
    entry.write_text(json.dumps(slow))
    again = Pipeline(*folders)
    _, m = again.generate(PROMPTS, 4)
    assert m.calibration_s > 0 and again.speculation.target_cost(1) < slow["target"][0][1] / 10
    assert json.loads(entry.read_text())["target"][0][1] < slow["target"][0][1] / 10


@pytest.mark.parametrize(
    "damage",
    ["{not json", json.dumps({"target": [[1, 0.001]]}), json.dumps({"target": [[r, -1.0] for r in CALIBRATION_ROWS],
                                                                  "draft": [[r, 0.001] for r in CALIBRATION_ROWS]})],
)  # fmt: skip
def test_a_damaged_entry_is_timed_again_not_an_error(folders, tmp_path, monkeypatch, damage):
    monkeypatch.setenv("OVBUILD_CACHE_DIR", str(tmp_path))
    Pipeline(*folders).generate(PROMPTS, 4)
    [entry] = entries(tmp_path)
    entry.write_text(damage)
    _, m = Pipeline(*folders).generate(PROMPTS, 4)
    assert m.calibration_s > 0
    assert len(json.loads(entry.read_text())["draft"]) == len(CALIBRATION_ROWS)


def test_the_key_follows_graphs_machine_and_settings_not_the_folder(folders, tmp_path, tiny_target, tiny_draft):
    target, draft = folders
    other_place = export_pair(tiny_target, tiny_draft, tmp_path / "elsewhere")
    assert folder_identity(other_place[0]) == folder_identity(target)
    key = calibration_key(target, draft, "CPU; f32")
    assert calibration_key(*other_place, "CPU; f32") == key  # same graphs and weight sizes: same call times
    assert calibration_key(target, draft, "CPU; bf16") != key
    assert calibration_key(draft, target, "CPU; f32") != key


def test_the_planner_is_seeded_only_where_no_cache_is_asked_for(folders, tmp_path, monkeypatch):
    monkeypatch.setenv("OVBUILD_CACHE_DIR", str(tmp_path))
    pipeline = Pipeline(*folders, RuntimeOptions(calibration_cache=False))
    assert pipeline.speculation.calibration_cache is None
    pipeline.generate(PROMPTS, 4)
    assert entries(tmp_path) == []
    assert isinstance(Pipeline(*folders).speculation.calibration_cache, CalibrationCache)


def test_generate_recalibrate_flag(folders, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OVBUILD_CACHE_DIR", str(tmp_path))
    target, draft = folders
    seen = []
    real = calibration.CalibrationCache.for_pair

    def for_pair(*args, **kwargs):
        cache = real(*args, **kwargs)
        seen.append(cache.refresh)
        return cache

    monkeypatch.setattr(calibration.CalibrationCache, "for_pair", for_pair)
    base = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "ab", "--max-new-tokens", "4"]
    assert main(base) == 0 and main([*base, "--recalibrate"]) == 0
    assert seen == [False, True]
