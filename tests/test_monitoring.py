"""SwanLab monitoring: which mode a run logs in, and the sample-trajectory table with its rewards."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from agentic_rag.training.config import LoggingConfig
from agentic_rag.training.monitoring import init_swanlab, render_table, resolve_mode, sample_table


def test_auto_mode_is_cloud_with_a_key_and_offline_without():
    assert resolve_mode("auto", {"SWANLAB_API_KEY": "k"}) == "cloud"
    assert resolve_mode("auto", {}) == "local"  # what `swanlab watch` shows
    assert resolve_mode("auto", {"SWANLAB_API_KEY": ""}) == "local"
    for explicit in ("offline", "cloud", "local", "disabled"):  # an explicit mode wins over the key
        assert resolve_mode(explicit, {"SWANLAB_API_KEY": "k"}) == explicit
        assert resolve_mode(explicit, {}) == explicit


@pytest.fixture()
def swanlab_calls(monkeypatch):
    import swanlab

    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(swanlab, "login", lambda **kw: calls.append(("login", kw)))
    monkeypatch.setattr(swanlab, "init", lambda **kw: calls.append(("init", kw)))
    return calls


def test_init_swanlab_logs_in_only_for_the_cloud(swanlab_calls, monkeypatch, tmp_path):
    monkeypatch.setenv("SWANLAB_API_KEY", "secret")
    assert init_swanlab(LoggingConfig(), str(tmp_path), {}, is_main=True) == str(tmp_path / "swanlog")
    assert swanlab_calls[0] == ("login", {"api_key": "secret"})
    assert swanlab_calls[1][0] == "init" and swanlab_calls[1][1]["mode"] == "online"
    swanlab_calls.clear()
    init_swanlab(LoggingConfig(swanlab_mode="offline"), str(tmp_path), {}, is_main=True)  # explicit wins
    assert [c[0] for c in swanlab_calls] == ["init"] and swanlab_calls[0][1]["mode"] == "offline"
    swanlab_calls.clear()
    monkeypatch.delenv("SWANLAB_API_KEY")
    init_swanlab(LoggingConfig(), str(tmp_path), {}, is_main=True)
    assert [c[0] for c in swanlab_calls] == ["init"] and swanlab_calls[0][1]["mode"] == "local"
    swanlab_calls.clear()
    assert init_swanlab(LoggingConfig(swanlab_mode="disabled"), str(tmp_path), {}, is_main=True) is None
    assert init_swanlab(LoggingConfig(), str(tmp_path), {}, is_main=False) is None
    assert not swanlab_calls
    with pytest.raises(ValueError, match="SWANLAB_API_KEY is not set"):
        init_swanlab(LoggingConfig(swanlab_mode="cloud"), str(tmp_path), {}, is_main=True)


def traj(question, answer, queries=(), finish="answer"):
    events = [{"type": "search", "queries": [q], "results": []} for q in queries]
    return SimpleNamespace(question=question, answer=answer, events=events, finish_reason=finish,
                           num_searches=len(queries))


def test_the_sample_table_shows_each_trajectory_s_rewards():
    trajs = [traj("Who | what?", "Paris", ["capital of france"]), traj("Q2", None, finish="max_turns")]
    table = render_table(trajs, [[1.0, 0.5], [0.0, math.nan]], ["f1", "ragas"], [1.0, 0.2]).splitlines()
    assert table[0] == "| question | answer | finish | searches | queries | reward | f1 | ragas |"
    assert table[1] == "|---|---|---|---|---|---|---|---|"
    # total = the weighted sum TRL pays, a function that did not apply (NaN) left out
    assert table[2] == "| Who \\| what? | Paris | answer | 1 | capital of france | 1.100 | 1.000 | 0.500 |"
    assert table[3] == "| Q2 | None | max_turns | 0 |  | 0.000 | 0.000 | n/a |"
    assert render_table(trajs[1:], [[math.nan, None]], ["f1", "ragas"]).splitlines()[2].endswith("| n/a | n/a | n/a |")
    # without rewards, the plain table
    assert render_table(trajs[:1]).splitlines()[0] == "| question | answer | finish | searches | queries |"


def test_sample_table_reads_this_process_s_rows_of_the_gathered_rewards():
    mine = [traj("q0", "a"), traj("q1", "b"), traj("q2", "c")]
    gathered = torch.tensor([[0.1, 1.0], [0.2, 0.0], [0.3, 1.0],  # process 0
                             [0.4, 0.0], [0.5, 1.0], [0.6, 0.0]])  # process 1
    trainer = SimpleNamespace(_last_trajectories=mine, _rewards_per_func=gathered,
                              accelerator=SimpleNamespace(process_index=1), reward_weights=torch.tensor([1.0, 2.0]),
                              reward_func_names=["f1", "format"])
    rows = sample_table(trainer, 2).splitlines()
    assert rows[0].endswith("| reward | f1 | format |") and len(rows) == 4
    assert rows[2].endswith("| 0.400 | 0.400 | 0.000 |") and rows[3].endswith("| 2.500 | 0.500 | 1.000 |")
    trainer._rewards_per_func = None  # before the first scoring: the plain table
    assert sample_table(trainer, 2).splitlines()[0].endswith("| queries |")
