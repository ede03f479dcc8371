"""The evaluation harness end to end: an OpenAI-compatible endpoint policy (a fake server on 127.0.0.1 playing
scripted turns) searching a real Lucene index, a local tiny model with a LoRA adapter loaded by path, the
judge, resume after an interruption, the report, and every bad input."""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai  # noqa: F401 - imported up front: its cold import (seconds) is not what the timings measure
import pytest
import yaml

from agentic_rag.cli import main
from agentic_rag.endpoints import EndpointError
from agentic_rag.evaluation.config import EvalConfigError, config_from_dict, load_eval_config
from agentic_rag.evaluation.runner import run_evaluation
from agentic_rag.rollout.decoding import STOP_EOS, STOP_LENGTH
from agentic_rag.rollout.remote import UNREPORTED, OpenAICompletionsPolicy
from conftest import free_port, shared, tiny_qwen_config
from fake_openai import FakeOpenAI, ScriptedCompletions, chat_reply

DEV = "tts-project/2wikimultihopqa_dev500.json"


@pytest.fixture(scope="module")
def tok_dir(qwen_tokenizer, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tokenizer")
    qwen_tokenizer.save_pretrained(str(d))
    return d


def dev_rows(n: int) -> list[dict]:
    return json.loads(shared(DEV).read_text())[:n]


def scripts_for(rows: list[dict]) -> dict[str, list[str]]:
    """Questions 0, 2, 4: search then answer right; 1, 3: search then answer wrong; 5: answer at once."""
    scripts = {}
    for i, r in enumerate(rows):
        answer = r["answer"] if i % 2 == 0 or i == 5 else "a wrong guess"
        turns = [f"<think>I will look it up.</think>\n<search>{r['question']}</search>", f"<answer>{answer}</answer>"]
        scripts[r["question"]] = turns[1:] if i == 5 else turns
    return scripts


def judge_handler(golds: dict[str, str]):
    """Says yes when the prediction is the gold answer, no otherwise, and rambles for one question."""

    def handle(body):
        prompt = body["messages"][1]["content"]
        pred = prompt.split("Predicted answer: ", 1)[1].split("\n", 1)[0]
        if "West Of Shanghai" in prompt:
            return chat_reply("It is hard to say.")
        return chat_reply("yes" if pred in golds.values() else "no")

    return handle


def endpoint_config(url: str, tok_dir: Path, index: Path, out: Path, **over) -> dict:
    cfg = {
        "name": "endpoint-run",
        "dataset": {"path": str(shared(DEV)), "limit": 6},
        "policy": {"type": "endpoint", "model": "fake-model", "base_url": url, "tokenizer": str(tok_dir),
                   "concurrency": 3},
        "search": {"index": str(index), "retriever": "bm25"},
        "rollout": {"passages_per_search": 2, "max_tokens_per_turn": 128, "max_completion_tokens": 1024},
        "batch_size": 6,
        "output_dir": str(out),
    }
    for dotted, value in over.items():
        section, _, key = dotted.partition("__")
        if key:
            cfg.setdefault(section, {})[key] = value
        else:
            cfg[section] = value
    return cfg


# ------------------------------------------------------------------------------------------ remote policy


def test_completions_are_mapped_back_with_the_stripped_stop(qwen_tokenizer):
    tok = qwen_tokenizer
    policy = OpenAICompletionsPolicy("http://127.0.0.1:9/v1", "m", tok, check=False)
    stops = ["</search>", "</answer>", "</backtrack>", "</summary>"]

    def gen(text, finish="stop", matched=UNREPORTED, stop_strings=stops, budget=64):
        g = policy.to_generation(text, finish, matched, stop_strings, budget)
        return tok.decode(g.ids), g.stop

    # vLLM reports the matched stop string; generic servers only say "stop": the open tag tells which
    assert gen("<think>a</think>\n<search>capital", matched="</search>") == (
        "<think>a</think>\n<search>capital</search>", "</search>")
    assert gen("<think>a</think>\n<search>capital") == ("<think>a</think>\n<search>capital</search>", "</search>")
    assert gen("<search>x</search> then <answer>Paris") == ("<search>x</search> then <answer>Paris</answer>",
                                                            "</answer>")
    assert gen("<answer>kept</answer>", matched="</answer>") == ("<answer>kept</answer>", "</answer>")  # not doubled
    # EOS: vLLM's stop_reason None, or nothing open; the EOS token ends the ids as with a local model
    assert gen("I do not know.", matched=None) == ("I do not know.<|im_end|>", STOP_EOS)
    assert gen("I do not know.") == ("I do not know.<|im_end|>", STOP_EOS)
    assert gen("<search>unfinished", matched=None) == ("<search>unfinished<|im_end|>", STOP_EOS)  # the server said EOS
    assert gen("<search>long", finish="length") == ("<search>long", STOP_LENGTH)
    # R1-Searcher's tags
    r1 = ["<|end_of_query|>", "</answer>"]
    assert gen("think <|begin_of_query|> Fort Hood", stop_strings=r1) == (
        "think <|begin_of_query|> Fort Hood<|end_of_query|>", "<|end_of_query|>")


def test_endpoint_eval_end_to_end_with_a_real_index_and_the_judge(tmp_path, tok_dir, wiki_index):
    rows = dev_rows(6)
    scripted = ScriptedCompletions(scripts_for(rows), vllm=lambda q: len(q) % 2 == 0)
    golds = {r["question"]: r["answer"] for r in rows}
    with FakeOpenAI(completions=scripted, chat=judge_handler(golds), models=("fake-model", "judge"),
                    delay=0.05) as srv:
        data = endpoint_config(srv.url, tok_dir, wiki_index, tmp_path / "run",
                               metrics=["em", "f1", "cover_em", "judge", "well_formed"],
                               judge={"base_url": srv.url, "model": "judge", "timeout_s": 5})
        summary = run_evaluation(config_from_dict(data), progress=False)
        # a round's turns went out concurrently, at most `concurrency` at once
        assert srv.max_in_flight_by_path["/v1/completions"] == 3
    recs = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in recs] == [r["id"] for r in rows]
    assert [r["prediction"] for r in recs] == [rows[0]["answer"], "a wrong guess", rows[2]["answer"],
                                               "a wrong guess", rows[4]["answer"], rows[5]["answer"]]
    assert [r["metrics"]["em"] for r in recs] == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    assert [r["num_searches"] for r in recs] == [1, 1, 1, 1, 1, 0]
    first = recs[0]
    assert first["queries"] == [rows[0]["question"]] and first["finish_reason"] == "answer"
    # the observation came from the real index: the gold passage about the song's performer is in it
    assert "<observation>" in first["trajectory"] and "Aretha Franklin" in first["trajectory"]
    assert first["trajectory"].endswith(f"<answer>{rows[0]['answer']}</answer>")
    assert first["gold"][0] == "Detroit" and first["latency_s"] > 0
    assert recs[1]["judge"] == {"status": "garbage", "reply": "It is hard to say."}
    m = summary["metrics"]
    assert summary["n"] == 6 and m["em"] == pytest.approx(4 / 6) and m["cover_em"] == pytest.approx(4 / 6)
    assert m["well_formed"] == 1.0 and m["judge"] == pytest.approx(4 / 5)  # one garbage reply: judged 5
    assert summary["judge"]["garbage"] == 1 and summary["judge"]["judged"] == 5
    assert summary["searches_per_question"] == pytest.approx(5 / 6)
    assert summary["latency_s"]["p50"] is not None and summary["finish_reasons"] == {"answer": 6}
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["metrics"] == summary["metrics"] and on_disk["config"]["policy"]["base_url"] == srv.url


def test_interrupted_eval_resumes_without_redoing_finished_examples(tmp_path, tok_dir, wiki_index):
    rows = dev_rows(6)
    scripted = ScriptedCompletions(scripts_for(rows))
    with FakeOpenAI(completions=scripted, models=("fake-model",)) as srv:
        data = endpoint_config(srv.url, tok_dir, wiki_index, tmp_path / "run", batch_size=2)
        cfg = config_from_dict(data)

        def crash(index, records):
            if index == 1:
                raise KeyboardInterrupt  # the user pressed Ctrl-C after the second batch

        with pytest.raises(KeyboardInterrupt):
            run_evaluation(cfg, progress=False, on_batch=crash)
        pred = tmp_path / "run" / "predictions.jsonl"
        assert [json.loads(x)["id"] for x in pred.read_text().splitlines()] == [r["id"] for r in rows[:4]]
        with open(pred, "a") as f:  # and a write torn by a crash
            f.write('{"id": "torn", "quest')
        summary = run_evaluation(cfg, progress=False)
    ids = [json.loads(x)["id"] for x in pred.read_text().splitlines()]
    assert ids == [r["id"] for r in rows] and summary["n"] == 6
    assert scripted.first_turns == {r["question"]: 1 for r in rows}  # nothing finished was rolled out again
    assert summary["this_session"]["examples"] == 2
    # extending the limit is a resume too; changing the model is refused
    with FakeOpenAI(completions=ScriptedCompletions(scripts_for(dev_rows(8)) | {}), models=("fake-model",)) as srv2:
        data2 = endpoint_config(srv2.url, tok_dir, wiki_index, tmp_path / "run", batch_size=2)
        data2["dataset"]["limit"] = 6
        with pytest.raises(EvalConfigError, match=r"another config \(differs in: policy.base_url\)"):
            run_evaluation(config_from_dict(data2), progress=False)
        assert run_evaluation(config_from_dict(data2), progress=False, overwrite=True)["n"] == 6


# ------------------------------------------------------------------------------------------ local model


def test_local_model_with_a_lora_adapter_loaded_by_path_and_the_report(tmp_path, qwen_tokenizer, wiki_index):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_qwen_config(len(qwen_tokenizer)))
    model_dir, adapter_dir = tmp_path / "tiny-qwen", tmp_path / "adapter"
    model.save_pretrained(str(model_dir))
    qwen_tokenizer.save_pretrained(str(model_dir))
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    lora.save_pretrained(str(adapter_dir))
    base = {"dataset": {"path": str(shared(DEV)), "limit": 3},
            "policy": {"type": "local", "model": str(model_dir), "device": "cpu"},
            "search": {"index": str(wiki_index)},
            "rollout": {"max_tokens_per_turn": 12, "max_completion_tokens": 40, "passages_per_search": 2},
            "batch_size": 2}
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(base))
    assert main(["eval", "--config", str(cfg_path), "--output-dir", str(tmp_path / "base"), "--no-progress"]) == 0
    assert main(["eval", "--config", str(cfg_path), "--output-dir", str(tmp_path / "lora"), "--no-progress",
                 "--set", f"policy.adapter={adapter_dir}", "--set", "name=tiny-lora"]) == 0
    runs = {}
    for name in ("base", "lora"):
        runs[name] = [json.loads(x) for x in (tmp_path / name / "predictions.jsonl").read_text().splitlines()]
        assert len(runs[name]) == 3 and all(r["completion_tokens"] > 0 for r in runs[name])
    # random weights: the adapter changes what the model writes
    assert [r["trajectory"] for r in runs["base"]] != [r["trajectory"] for r in runs["lora"]]
    summary = json.loads((tmp_path / "lora" / "summary.json").read_text())
    assert summary["policy"]["adapter"] == str(adapter_dir) and summary["run"] == "tiny-lora"
    assert set(summary["metrics"]) == {"em", "f1", "cover_em", "well_formed"}
    out = tmp_path / "report" / "report.md"
    assert main(["eval-report", "--runs", str(tmp_path / "base"), str(tmp_path / "lora"), "--out", str(out)]) == 0
    md = out.read_text()
    assert "| run | n | EM | F1 | cover-EM (ACC_R) | well-formed |" in md
    assert "| tiny |" in md and "| tiny-lora |" in md and "![metrics by run](report.png)" in md
    assert "on 3 shared questions" in md
    png = out.with_suffix(".png")
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_without_a_yaml_runs_from_flags_alone(tmp_path, tiny_model_dir, wiki_index, capsys):
    """``agentic-rag eval --model M --questions FILE --index DIR --limit N --out DIR``: no config file; --set
    reaches the rollout settings, and the summary's config records every value the run used."""
    out = tmp_path / "run"
    argv = ["eval", "--model", str(tiny_model_dir), "--questions", str(shared(DEV)), "--index", str(wiki_index),
            "--limit", "2", "--out", str(out), "--no-progress", "--set", "policy.device=cpu",
            "--set", "rollout.max_turns=2", "--set", "rollout.max_completion_tokens=64",
            "--set", "rollout.max_tokens_per_turn=16"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["output_dir"] == str(out) and printed["n"] == 2
    recs = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and [r["id"] for r in recs] == [r["id"] for r in dev_rows(2)]
    assert all(0 < r["completion_tokens"] <= 64 and r["num_turns"] <= 2 for r in recs)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 2 and summary["run"] == tiny_model_dir.name  # the run is named after the model
    config = summary["config"]
    assert config["rollout"]["max_turns"] == 2 and config["rollout"]["max_completion_tokens"] == 64
    assert config["rollout"]["max_tokens_per_turn"] == 16
    assert config["policy"]["model"] == str(tiny_model_dir) and config["policy"]["type"] == "local"
    assert config["dataset"]["path"] == str(shared(DEV)) and config["dataset"]["limit"] == 2
    assert config["search"]["index"] == str(wiki_index) and config["output_dir"] == str(out)
    assert config["sampling"]["temperature"] == 0.0  # evaluation decodes greedily by default
    # without a YAML the model, the questions and the index are needed: one clear line says so
    assert main(["eval", "--model", str(tiny_model_dir), "--questions", str(shared(DEV))]) == 2
    assert "--model M --questions FILE --index DIR_OR_URL" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ bad input


def test_unreachable_endpoint_fails_fast_with_its_url(tmp_path, tok_dir, wiki_index, capsys):
    url = f"http://127.0.0.1:{free_port()}/v1"
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(endpoint_config(url, tok_dir, wiki_index, tmp_path / "out")))
    t0 = time.time()
    assert main(["eval", "--config", str(cfg_path), "--no-progress"]) == 2
    assert time.time() - t0 < 5
    err = capsys.readouterr().err
    assert f"cannot reach the policy endpoint at {url}" in err
    with pytest.raises(EndpointError, match=url):
        OpenAICompletionsPolicy(url, "m", None)


def test_bad_config_reports_every_problem_at_once(tmp_path, tok_dir, capsys):
    bad = {
        "datset": {"path": "x"},
        "dataset": {"path": str(tmp_path / "missing.jsonl"), "format": "hotpot", "limit": 0},
        "policy": {"type": "endpoint", "model": "m", "base_url": "localhost:8000", "concurrency": "many"},
        "search": {"index": str(tmp_path / "no-index"), "retriever": "bm52"},
        "rollout": {"dialect": "agentik", "max_tokens_per_turn": 4096, "max_completion_tokens": 1024,
                    "passages_per_search": 0},
        "sampling": {"temperature": -1},
        "metrics": ["em", "acc", "judge"],
    }
    cfg_path = tmp_path / "bad.yaml"
    cfg_path.write_text(yaml.safe_dump(bad))
    with pytest.raises(EvalConfigError) as info:
        load_eval_config(cfg_path)
    problems = info.value.problems
    assert problems[:2] == ["datset is not a setting; did you mean 'dataset'?",
                            "policy.concurrency must be an integer, got 'many'"]
    assert len(problems) == 16 and not any(p.startswith("policy.concurrency must be >=") for p in problems)
    t0 = time.time()
    assert main(["eval", "--config", str(cfg_path)]) == 2
    assert time.time() - t0 < 5  # nothing was loaded
    err = capsys.readouterr().err
    assert "16 problem(s)" in err
    for expected in (f"dataset.path: no such file {tmp_path / 'missing.jsonl'}",
                     "dataset.format must be one of auto, generic, hotpotqa",
                     "got 'hotpot' (did you mean 'hotpotqa'?)",
                     "dataset.limit must be >= 1, got 0",
                     "policy.base_url must be the endpoint's http(s) URL",
                     "policy.tokenizer is empty: an endpoint policy needs the served model's tokenizer",
                     "sampling.temperature must be >= 0, got -1",
                     f"search.index: no index at {tmp_path / 'no-index'} (build one: agentic-rag index build",
                     "search.retriever must be one of bm25, dense, hybrid, random; got 'bm52' (did you mean 'bm25'?)",
                     "rollout.passages_per_search must be >= 1, got 0",
                     "rollout.dialect must be one of agentic, search-r1, r1-searcher, native; got 'agentik' "
                     "(did you mean 'agentic'?)",
                     "rollout.max_tokens_per_turn (4096) exceeds rollout.max_completion_tokens (1024)",
                     "metrics has unknown metric 'acc'; known metrics: em, f1, cover_em, judge, choice, well_formed",
                     "judge.base_url is empty", "judge.model is empty"):
        assert expected in err, expected


def test_config_environment_variables_and_overrides(tmp_path, tok_dir, wiki_index):
    data = endpoint_config("${EVAL_TEST_URL:-http://127.0.0.1:1/v1}", tok_dir, wiki_index, tmp_path / "o")
    data["policy"]["model"] = "${EVAL_TEST_MODEL}"
    with pytest.raises(EvalConfigError, match="policy.model: environment variable EVAL_TEST_MODEL is not set"):
        config_from_dict(data, env={})
    cfg = config_from_dict(data, env={"EVAL_TEST_MODEL": "served-name"},
                           overrides=["policy.concurrency=5", "rollout.dialect=search-r1"])
    assert cfg.policy.model == "served-name" and cfg.policy.base_url == "http://127.0.0.1:1/v1"
    assert cfg.policy.concurrency == 5 and cfg.rollout.dialect == "search-r1"
    assert cfg.resolved_metrics("hotpotqa") == ["em", "f1", "cover_em", "well_formed"]
    assert cfg.resolved_metrics("medqa")[-1] == "choice"
    with pytest.raises(EvalConfigError, match="--set 'oops': expected NAME=VALUE, e.g. rollout.max_searches=2"):
        config_from_dict(data, env={"EVAL_TEST_MODEL": "x"}, overrides=["oops"])


def test_missing_gold_field_names_the_field_and_line(tmp_path, tok_dir, wiki_index, capsys):
    path = tmp_path / "qs.jsonl"
    path.write_text('{"idx": 1, "question": "Who?", "answer": "Me"}\n{"idx": 2, "question": "What?"}\n')
    data = endpoint_config("http://127.0.0.1:1/v1", tok_dir, wiki_index, tmp_path / "o")
    data["dataset"] = {"path": str(path)}
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    assert main(["eval", "--config", str(cfg_path)]) == 2
    assert f"{path}:2: missing field 'answer' (no gold answer)" in capsys.readouterr().err


def test_example_configs_match_the_schema(tmp_path):
    """The shipped configs use only real settings; what they lack on this machine is only the placeholders."""
    from conftest import ROOT

    env = {"EVAL_MODEL_PATH": str(tmp_path / "model"), "EVAL_TOKENIZER_PATH": str(tmp_path / "tok"),
           "JUDGE_BASE_URL": "http://127.0.0.1:1/v1", "JUDGE_MODEL": "judge"}
    for path in sorted((ROOT / "experiments" / "evaluation").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        data["dataset"]["path"] = str(shared(DEV))  # the shared data may live elsewhere
        try:
            config_from_dict(data, env=env, source=path.name)
        except EvalConfigError as exc:
            # the placeholders: models, tokenizers and indexes built on the user's machine (the replay's tokenizer
            # is the tiny model experiments/evaluation/tiny_model.py writes under outputs/)
            allowed = ("policy.model: no such model directory", "policy.tokenizer: no such tokenizer directory",
                       "policy.tokenizer: 'outputs/tiny-qwen/model' is not a local path",
                       "search.index: no index at")
            assert all(p.startswith(allowed) for p in exc.problems), (path.name, exc.problems)


# ------------------------------------------------------------------------------------------ MedQA


MEDQA = "medqa/medqa_us_4opt_test.jsonl"


def medqa_rows(indices: list[int]) -> list[dict]:
    lines = shared(MEDQA).read_text().splitlines()
    return [json.loads(lines[i]) for i in indices]


def medqa_config(url: str, tok_dir: Path, path: Path, out: Path, **over) -> dict:
    """An endpoint run over MedQA rows, closed book (the scripts answer at once)."""
    data = endpoint_config(url, tok_dir, Path("unused"), out, **over)
    data["dataset"] = {"path": str(path), **over.get("dataset", {})}
    data["search"] = {"index": "none"}
    return data


def test_medqa_endpoint_eval_scores_the_option_letter(tmp_path, tok_dir):
    # real rows whose gold letters are B, C, D, D, B
    rows = medqa_rows([0, 6, 1, 3, 4])
    assert [r["answer_idx"] for r in rows] == ["B", "C", "D", "D", "B"]
    path = tmp_path / "medqa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers = ["B", "(C)", rows[2]["options"]["D"], "A", "The answer is B"]
    scripted = ScriptedCompletions({r["question"]: [f"<answer>{a}</answer>"] for r, a in zip(rows, answers,
                                                                                            strict=True)})
    with FakeOpenAI(completions=scripted, models=("fake-model",)) as srv:
        summary = run_evaluation(config_from_dict(medqa_config(srv.url, tok_dir, path, tmp_path / "run")),
                                 progress=False)
    # the prompt listed the options and asked for the letter
    prompts = [b["prompt"] for b in srv.bodies("/v1/completions")]
    assert len(prompts) == 5 and all("Options:\nA. " in p and "Answer with the letter" in p for p in prompts)
    recs = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in recs] == answers
    assert [r["metrics"]["choice"] for r in recs] == [1.0, 1.0, 1.0, 0.0, 1.0]
    for rec, row in zip(recs, rows, strict=True):
        assert rec["meta"]["options"] == row["options"] and rec["meta"]["answer_idx"] == row["answer_idx"]
        assert rec["gold"] == [row["answer_idx"], row["answer"]]
    # EM / cover-EM compare with the option text only: a bare letter, or a sentence holding the gold letter,
    # is not "covered" by the letter
    assert [r["metrics"]["em"] for r in recs] == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert [r["metrics"]["cover_em"] for r in recs] == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert summary["metrics_requested"] == ["em", "f1", "cover_em", "well_formed", "choice"]
    assert summary["n"] == 5 and summary["metrics"]["choice"] == pytest.approx(4 / 5)
    assert summary["metrics"]["cover_em"] == pytest.approx(1 / 5) and summary["metrics"]["well_formed"] == 1.0


# ------------------------------------------------------------------------------------------ Ctrl-C


def test_ctrl_c_exits_130_with_a_resume_hint_and_the_rerun_finishes_the_rest(tmp_path, tok_dir, monkeypatch, capsys):
    from agentic_rag.evaluation import runner

    rows = medqa_rows(list(range(6)))
    scripted = ScriptedCompletions({r["question"]: [f"<answer>{r['answer_idx']}</answer>"] for r in rows})
    real_run_batch = runner._run_batch
    calls = []

    def ctrl_c_in_the_third_batch(*args, **kwargs):
        calls.append(1)
        records = real_run_batch(*args, **kwargs)
        if len(calls) == 3:
            raise KeyboardInterrupt  # pressed while the third batch was being scored: it is not saved
        return records

    out = tmp_path / "run"
    with FakeOpenAI(completions=scripted, models=("fake-model",)) as srv:
        data = medqa_config(srv.url, tok_dir, shared(MEDQA), out, batch_size=2)
        data["dataset"]["limit"] = 6
        cfg_path = tmp_path / "medqa.yaml"
        cfg_path.write_text(yaml.safe_dump(data))
        argv = ["eval", "--config", str(cfg_path), "--no-progress"]
        monkeypatch.setattr(runner, "_run_batch", ctrl_c_in_the_third_batch)
        assert main(argv) == 130
        err = capsys.readouterr().err
        assert (f"interrupted: finished examples are in {out}/predictions.jsonl; rerun the same command to resume"
                in err)
        pred = out / "predictions.jsonl"
        assert [json.loads(x)["id"] for x in pred.read_text().splitlines()] == ["0", "1", "2", "3"]
        assert not (out / "summary.json").exists()
        monkeypatch.setattr(runner, "_run_batch", real_run_batch)
        assert main(argv) == 0
        printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [json.loads(x)["id"] for x in pred.read_text().splitlines()] == [str(i) for i in range(6)]
    assert printed["n"] == 6 and printed["this_session"]["examples"] == 2 and printed["metrics"]["choice"] == 1.0
    # the finished four were not rolled out again; the batch lost to Ctrl-C was
    assert [scripted.first_turns[r["question"]] for r in rows] == [1, 1, 1, 1, 2, 2]


def test_the_report_reads_runs_written_before_well_formed_was_renamed(tmp_path):
    """A summary.json and predictions.jsonl from before the rename call well_formed 'format': the report reads
    either, and puts both under one column."""
    from agentic_rag.evaluation.report import Run, markdown_table, paired_lines

    for name, key, value in (("old", "format", 0.5), ("new", "well_formed", 1.0)):
        d = tmp_path / name
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"run": name, "n": 2, "metrics": {"em": value, key: value}}))
        (d / "predictions.jsonl").write_text("".join(json.dumps({"id": str(i), "metrics": {"em": value, key: value}})
                                                     + "\n" for i in range(2)))
    runs = [Run(tmp_path / "old"), Run(tmp_path / "new")]
    table = markdown_table(runs)
    assert "| run | n | EM | well-formed |" in table and "| old | 2 | 0.500 | 0.500 |" in table
    assert "| new | 2 | 1.000 | 1.000 |" in table
    assert paired_lines(runs) == ["- **new** vs **old** on 2 shared questions: EM +2 / -0"]
