"""The wiki quick start's own settings, tested without the shared data (the end-to-end run in
test_wiki_quickstart.py checks what they make): ``--sft-cpu-autocast``, the real model's SFT under bf16 autocast where
the CPU has it natively (issue 31's cost: 1187 s against 2410 s in fp32 on the 2-core machine,
experiments/wiki/README.md), and ``--random-passages``, the ablation rows that are not run by default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_real_model_sft_runs_under_the_cpu_autocast_setting(tmp_path, monkeypatch):
    """The real model's SFT is the quick start's longest part: it runs under ``sft_cpu_autocast`` (``auto``: bf16
    where the CPU has it natively), which the output directory's settings record, so a run made in fp32 is not
    resumed in bf16; the tiny model's full fine-tune stays fp32."""
    from agentic_rag.demo import wiki
    from agentic_rag.training import sft as sft_module

    seen = []

    def fake_run_sft(**kw):
        seen.append(kw)
        Path(kw["output_dir"]).mkdir(parents=True)  # where the real one writes the adapter
        return {"steps": 0}

    monkeypatch.setattr(sft_module, "run_sft", fake_run_sft)
    monkeypatch.setattr(sft_module, "run_sft_apart", lambda **kw: fake_run_sft(apart=True, **kw))
    real = wiki.WikiSettings(out=tmp_path / "real", seeds=[0])
    assert real.sft_cpu_autocast == "auto"
    wiki.sft(real, "smollm2-135m-instruct")
    assert seen[-1]["cpu_autocast"] == "auto" and seen[-1]["lora_r"] == 16 and seen[-1]["apart"]
    wiki.sft(wiki.WikiSettings(out=tmp_path / "fp32", seeds=[0], sft_cpu_autocast="none"), "smollm2-135m-instruct")
    assert seen[-1]["cpu_autocast"] == "none"
    wiki.sft(wiki.WikiSettings.for_tiny(out=tmp_path / "tiny", seeds=[0]), "tiny")
    assert seen[-1]["full"] is True and "cpu_autocast" not in seen[-1] and "apart" not in seen[-1]

    fresh = wiki.WikiSettings(out=tmp_path / "fresh", seeds=[0])
    wiki.check_settings(fresh)
    assert json.loads((fresh.out / "settings.json").read_text())["sft_cpu_autocast"] == "auto"
    with pytest.raises(SystemExit, match="sft_cpu_autocast"):
        wiki.check_settings(wiki.WikiSettings(out=fresh.out, seeds=[0], sft_cpu_autocast="none"))
    with pytest.raises(ValueError, match="bfloat16"):  # a typo is refused, not trained in fp32
        wiki.WikiSettings(out=fresh.out, seeds=[0], sft_cpu_autocast="bfloat16")


def test_quickstart_sft_cpu_autocast_flag(tmp_path, monkeypatch, capsys):
    """``--sft-cpu-autocast`` reaches the wiki settings; the world task and the tiny model refuse it."""
    from agentic_rag.demo import quickstart, wiki

    got = []
    monkeypatch.setattr(wiki, "run", lambda ws: got.append(ws) or True)
    assert quickstart.main(["--task", "wiki", "--sft-cpu-autocast", "none", "--out", str(tmp_path / "o")]) == 0
    assert got[-1].sft_cpu_autocast == "none" and not got[-1].tiny
    assert quickstart.main(["--task", "wiki", "--out", str(tmp_path / "o")]) == 0
    assert got[-1].sft_cpu_autocast == "auto"
    for argv in (["--sft-cpu-autocast", "bf16"], ["--task", "wiki", "--tiny", "--sft-cpu-autocast", "bf16"]):
        with pytest.raises(SystemExit) as exc:
            quickstart.main(argv + ["--out", str(tmp_path / "x")])
        assert exc.value.code == 2
    assert "--sft-cpu-autocast" in capsys.readouterr().err


def test_quickstart_random_passages_flag(tmp_path, monkeypatch, capsys):
    """The random-passage ablation rows are asked for (``--random-passages``); not with --no-ablations or the world."""
    from agentic_rag.demo import quickstart, wiki

    got = []
    monkeypatch.setattr(wiki, "run", lambda ws: got.append(ws) or True)
    assert quickstart.main(["--task", "wiki", "--out", str(tmp_path / "o")]) == 0
    assert got[-1].ablations and not got[-1].random_passages
    assert quickstart.main(["--task", "wiki", "--random-passages", "--out", str(tmp_path / "o")]) == 0
    assert got[-1].ablations and got[-1].random_passages
    for argv in (["--random-passages"], ["--task", "wiki", "--no-ablations", "--random-passages"]):
        with pytest.raises(SystemExit) as exc:
            quickstart.main(argv + ["--out", str(tmp_path / "x")])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "are for --task wiki" in err and "pass one of the two" in err
