"""The evaluation runner: the rollout engine over a dataset, scored with one scorer, resumable.

Modes (``mode``: ``agent``, ``naive_rag``, ``direct``) and their prompts are in :mod:`.modes`; samples (``samples: N``)
are N copies of each question in the engine's batch, drawn at ``sampling.temperature``.

Reads top to bottom: read the questions; open the output directory and find what is already done; check
every endpoint (policy, judge) and open the searcher; load the tokenizer and the policy (a local model with
its optional LoRA adapter, or an OpenAI-compatible endpoint); then, batch by batch, roll the questions out
with :class:`~agentic_rag.rollout.AgentRollout`, ask the judge, score, and append one JSON line per example.

**Output** (``output_dir``):

* ``predictions.jsonl``: one line per finished example: ``id, question, gold, prediction, metrics``,
  ``answer_source`` (``tag``, ``reply``: a plain reply's answer span in ``direct`` / ``naive_rag`` mode, or None),
  ``judge`` (verdict status and reply), ``finish_reason, num_searches, num_turns, queries, search_errors``
  (failed search queries), ``searches_made`` (search queries carried out), ``latency_s, completion_tokens,
  model_tokens, trajectory`` (the completion text: model turns and
  observations) and a little ``meta`` (question kind and type, level, options); with ``samples: N`` > 1 these
  are the first sample's, and ``samples`` lists every sample's ``prediction, answer_source, metrics, finish_reason,
  num_searches, queries, search_errors, searches_made``; in ``naive_rag`` mode, ``retrieval`` holds the
  question's query, the docids and titles put in the prompt, and the search error if there was one;
* ``summary.json``: the run's summary (:func:`~.metrics.summarize`: with samples, ``samples.pass_at_n``,
  ``mean_over_samples`` and ``mixed_share``; with question kinds or types, ``by_kind`` / ``by_type``), the
  ``mode`` and the config that made it;
* ``config.json``: the resolved config, checked on resume.

**Resume.** Each batch's lines are written, flushed and fsynced as soon as the batch is scored; a rerun
with the same ``output_dir`` skips every id already in ``predictions.jsonl`` (a line torn by a crash is
dropped), so an interruption loses at most the batch in flight. A rerun whose config differs in anything
that changes results (model, adapter, dataset, search, rollout, sampling, mode, samples, metrics, judge) is
refused; ``limit``, batch sizes, concurrency and timeouts may change (raise ``limit`` to extend a run). A record
is written once all its samples are done.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..data.questions import QARow, prompt_question, read_questions
from ..errors import SearchFailuresError
from ..jsonl import FileFormatError, parse_line
from ..outputs import atomic_write_text, check_apart, claim_dir, mark_dir, output_lock
from ..rollout.events import calls_by_tool, failures_by_tool
from ..rollout.trajectory import search_outcomes
from .config import EvalConfig, EvalConfigError, config_to_dict
from .metrics import example_metrics, is_well_formed, summarize

log = logging.getLogger(__name__)

PREDICTIONS, SUMMARY, CONFIG = "predictions.jsonl", "summary.json", "config.json"
# settings that do not change results: they may differ between a run and its resumption
HARMLESS = {"name", "output_dir", "dataset.limit", "sampling.max_batch_size", "policy.concurrency", "policy.timeout_s",
            "policy.retries", "policy.device", "search.cache_size", "search.timeout_s", "search.max_failure_rate",
            "batch_size", "judge.timeout_s", "judge.max_concurrency", "judge.retries"}
# With --overwrite the new run is written here (inside output_dir) and moved over the old files only once it is
# complete; an interrupted --overwrite run leaves the old results whole and resumes from here.
NEXT = ".overwrite"
META_KEYS = ("kind", "type", "level", "setting", "hops", "answerable", "options", "answer_idx", "meta_info")

BatchHook = Callable[[int, list[dict[str, Any]]], None]
# settings added after runs were written: a run's config.json without one had its value (resume still works)
ADDED_DEFAULTS = {"mode": "agent", "samples": 1}


# ------------------------------------------------------------------------------------------------ output


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k != "extra_body":
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def output_inputs(cfg: EvalConfig) -> dict[str, str]:
    """The config's inputs on this machine, which its output directory must stay apart from."""
    pol = cfg.policy
    inputs = {"dataset.path": cfg.dataset.path, "policy.adapter": pol.adapter, "policy.tokenizer": pol.tokenizer,
              "search.index": "" if cfg.search.index == "none" else cfg.search.index}
    if pol.type == "local":
        inputs["policy.model"] = pol.model
    return inputs


def prepare_output(cfg: EvalConfig, overwrite: bool, move_aside: bool = False) -> Path:
    """Check the output directory before anything loads and return where this run writes its results.

    ``output_dir`` must stay apart from the inputs and be new, empty or an evaluation run's
    (:func:`agentic_rag.outputs.claim_dir`). Resuming: the run writes into ``output_dir``, and a directory holding
    a run made with another config is refused. ``overwrite``: the run writes into ``output_dir/.overwrite`` (an
    interrupted ``--overwrite`` run with the same config resumes there) and :func:`finish_overwrite` moves it over
    the old results once it is complete, so a run that fails on the way leaves the old results as they were."""
    out_dir = Path(cfg.output_dir)
    check_apart(out_dir, output_inputs(cfg), flag="output_dir")
    claim_dir(out_dir, "eval", flag="output_dir", move_aside=move_aside)
    work = out_dir / NEXT if overwrite else out_dir
    if overwrite and work.is_dir() and _config_differs(work, cfg):
        shutil.rmtree(work)  # an interrupted --overwrite run of another config: this command's own, never a result
    if not overwrite:
        differ = _config_differs(out_dir, cfg)
        if differ:
            raise EvalConfigError([f"{out_dir} holds a run made with another config (differs in: "
                                   f"{', '.join(differ)}); choose another output_dir or pass --overwrite (the old "
                                   f"results stay until the new run is complete)"], str(out_dir))
    mark_dir(out_dir, "eval")
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_text(work / CONFIG, json.dumps(config_to_dict(cfg), indent=2) + "\n")
    return work


def _config_differs(run_dir: Path, cfg: EvalConfig) -> list[str]:
    """The settings (other than :data:`HARMLESS` ones) in which the run in ``run_dir`` differs from ``cfg``; []
    when there is no run there yet."""
    path = run_dir / CONFIG
    if not (path.is_file() and (run_dir / PREDICTIONS).is_file()):
        return []
    try:
        old = {**ADDED_DEFAULTS, **_flat(json.loads(path.read_text(encoding="utf-8")))}
    except ValueError:
        raise EvalConfigError([f"{path} is damaged (not JSON); move the run away or pass --overwrite"],
                              str(path)) from None
    new = _flat(config_to_dict(cfg))
    return sorted(k for k in old.keys() | new.keys() if k not in HARMLESS and old.get(k) != new.get(k))


def finish_overwrite(out_dir: Path) -> None:
    """Move a complete ``--overwrite`` run from ``out_dir/.overwrite`` over the old results."""
    work = out_dir / NEXT
    for name in (PREDICTIONS, CONFIG):
        if (work / name).exists():
            os.replace(work / name, out_dir / name)
    shutil.rmtree(work, ignore_errors=True)


def load_done(path: Path) -> dict[str, dict[str, Any]]:
    """Finished records by id. A torn last line (a crash while writing) is cut off the file."""
    done: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return done
    with open(path, "rb+") as f:
        data = f.read()
        good_end, pos = 0, 0
        lines = data.split(b"\n")
        for i, raw in enumerate(lines):
            end = pos + len(raw) + (1 if i < len(lines) - 1 else 0)
            if raw.strip():
                try:
                    rec = parse_line(raw, path, i + 1)
                except FileFormatError:
                    if end >= len(data) and not data.endswith(b"\n"):
                        log.warning("%s: dropping a torn last line (an interrupted write)", path)
                        break
                    raise EvalConfigError([f"{path}:{i + 1}: not a JSON line; the file is damaged (move it away "
                                           f"or pass --overwrite)"], str(path)) from None
                if not isinstance(rec, dict) or "id" not in rec:
                    raise EvalConfigError([f"{path}:{i + 1}: not a record of agentic-rag eval (no 'id'): the file "
                                           f"is another program's; choose another output_dir"], str(path))
                done[str(rec["id"])] = rec
            good_end = end
            pos = end
        if good_end < len(data):
            f.truncate(good_end)
    return done


def append_records(f, records: Sequence[dict[str, Any]]) -> None:
    for rec in records:
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    f.flush()
    os.fsync(f.fileno())


# ------------------------------------------------------------------------------------------------ building


def build_tokenizer(cfg: EvalConfig):
    from ..models import load_tokenizer

    return load_tokenizer(cfg.policy.tokenizer or cfg.policy.model)


def sampling_params(cfg: EvalConfig):
    from ..rollout import SamplingParams

    s = cfg.sampling
    if s.temperature == 0:
        return SamplingParams(do_sample=False, top_p=s.top_p, top_k=s.top_k, repetition_penalty=s.repetition_penalty)
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          repetition_penalty=s.repetition_penalty)


def build_policy(cfg: EvalConfig, tokenizer):
    pol = cfg.policy
    if pol.type == "endpoint":
        from ..rollout.remote import OpenAICompletionsPolicy

        return OpenAICompletionsPolicy(pol.base_url, pol.model, tokenizer, sampling_params(cfg),
                                       api_key_env=pol.api_key_env, concurrency=pol.concurrency,
                                       timeout_s=pol.timeout_s, retries=pol.retries, extra_body=pol.extra_body)
    import torch

    from ..models import load_causal_lm
    from ..rollout import HFPolicy

    torch.manual_seed(cfg.seed)
    model = load_causal_lm(pol.model, adapter=pol.adapter or None, dtype=pol.dtype, device=pol.device or None,
                           merge_adapter=pol.merge_adapter)
    return HFPolicy(model, tokenizer, sampling_params(cfg), return_logprobs=False,
                    max_batch_size=cfg.sampling.max_batch_size or cfg.batch_size * cfg.samples)


def build_searcher(cfg: EvalConfig):
    """The config's searcher; None closed book (``search.index: none``, or ``mode: direct``, which opens none).
    ``search.retriever: random`` draws with the run's ``seed``."""
    if cfg.search.index == "none" or cfg.mode == "direct":
        return None
    from ..search import open_searcher

    return open_searcher(cfg.search.index, cfg.search.retriever, cache_size=cfg.search.cache_size,
                         timeout=cfg.search.timeout_s, seed=cfg.seed)


# ------------------------------------------------------------------------------------------------ running


def read_rows(cfg: EvalConfig) -> list[QARow]:
    d = cfg.dataset
    rows = read_questions(d.path, limit=d.limit, format=d.format, require_answers=True,
                          question_field=d.question_field or "question", answer_field=d.answer_field or None)
    seen: dict[str, int] = {}
    for row in rows:  # ids must be unique for resume; repeated ones get a suffix
        if row.id in seen:
            seen[row.id] += 1
            row.id = f"{row.id}#{seen[row.id]}"
        else:
            seen[row.id] = 1
    return rows


def prediction_of(traj, mode: str, dialect) -> tuple[str | None, str | None]:
    """What a trajectory is scored on, and where it came from: its answer tag (``tag``); in ``direct`` and
    ``naive_rag`` mode, a reply with no tag is scored on its answer span (``reply``: :func:`.modes.reply_answer`);
    else nothing (None, None)."""
    if traj.answer is not None:
        return traj.answer, "tag"
    if mode != "agent":
        from .modes import reply_answer

        answer = reply_answer(traj.text, dialect)
        if answer is not None:
            return answer, "reply"
    return None, None


def _scores(row: QARow, traj, metrics: list[str], verdict, prediction: str | None) -> dict[str, float | None]:
    options = row.meta.get("options") if isinstance(row.meta.get("options"), dict) else None
    well_formed = is_well_formed(traj.finish_reason, traj.answer, traj.events)
    return example_metrics(prediction, row.answers, metrics, options=options, well_formed=well_formed,
                           judge=None if verdict is None else verdict.value)


def _queries(traj) -> list[str]:
    """The queries a trajectory searched, in order."""
    from ..rollout.events import search_queries

    return search_queries(traj.events)


def _sample(row: QARow, traj, metrics: list[str], verdict, predicted: tuple[str | None, str | None]) -> dict[str, Any]:
    """One sample of a question (``samples`` > 1): its answer, metrics, ending and searches (the queries too, so a
    right sample's searches can be replayed as a training trajectory: rejection sampling)."""
    failed, made = search_outcomes(traj.events)
    out: dict[str, Any] = {"prediction": predicted[0], "answer_source": predicted[1],
                           "metrics": _scores(row, traj, metrics, verdict, predicted[0]),
                           "finish_reason": traj.finish_reason, "num_searches": traj.num_searches,
                           "queries": _queries(traj), "search_errors": failed, "searches_made": made}
    if verdict is not None:
        out["judge"] = {"status": verdict.status, "reply": verdict.raw}
    return out


def _record(row: QARow, traj, metrics: list[str], latency: float, verdict, predicted: tuple[str | None, str | None],
            samples: list[dict[str, Any]] | None = None, retrieval: dict[str, Any] | None = None) -> dict[str, Any]:
    """A question's line: its first sample's fields, then ``samples`` (all of them, when more than one) and
    ``retrieval`` (``naive_rag``'s search)."""
    scores = samples[0]["metrics"] if samples else _scores(row, traj, metrics, verdict, predicted[0])
    failed, made = search_outcomes(traj.events)
    rec: dict[str, Any] = {
        "id": row.id, "question": row.question, "gold": row.answers, "prediction": predicted[0],
        "answer_source": predicted[1], "metrics": scores,
        "finish_reason": traj.finish_reason, "num_searches": traj.num_searches, "num_turns": traj.num_turns,
        "queries": _queries(traj),
        "search_errors": failed, "searches_made": made,
        "tool_calls": dict(calls_by_tool(traj.events)), "tool_failures": dict(failures_by_tool(traj.events)),
        "latency_s": round(latency, 4), "completion_tokens": len(traj.completion_ids),
        "model_tokens": traj.model_tokens, "trajectory": traj.text,
        "meta": {k: row.meta[k] for k in META_KEYS if k in row.meta},
    }
    if verdict is not None:
        rec["judge"] = {"status": verdict.status, "reply": verdict.raw}
    if samples is not None:
        rec["samples"] = samples
    if retrieval is not None:
        rec["retrieval"] = retrieval
    return rec


def run_evaluation(cfg: EvalConfig, *, policy: Any = None, tokenizer: Any = None, searcher: Any = None,
                   judge: Any = None, progress: bool = True, overwrite: bool = False, move_aside: bool = False,
                   on_batch: BatchHook | None = None) -> dict[str, Any]:
    """Run (or resume) an evaluation; returns the summary (also written to ``output_dir/summary.json``).

    ``policy`` / ``tokenizer`` / ``searcher`` / ``judge`` replace what the config would build (tests,
    notebooks); ``on_batch(index, records)`` is called after each batch is on disk. A searcher the config builds
    must answer a probe query before the model loads. When more than ``search.max_failure_rate`` of the run's
    searches failed, the summary (written all the same, with ``search_failures``) is followed by
    :class:`~agentic_rag.errors.SearchFailuresError`: those numbers measure a broken search target.
    """
    from tqdm import tqdm

    from ..data.context import check_prompt_lengths, context_length
    from ..data.prompts import build_prompt
    from ..rollout import AgentRollout, RolloutHooks
    from ..rollout.protocol import get_dialect
    from .modes import mode_rollout, mode_system_prompt, user_message

    with output_lock(cfg.output_dir, "agentic-rag eval", flag="output_dir"):  # one run per output folder
        rows = read_rows(cfg)
        has_options = any(isinstance(r.meta.get("options"), dict) for r in rows)
        metrics = cfg.resolved_metrics("medqa" if has_options else cfg.dataset.format)
        out_dir = Path(cfg.output_dir)
        work = prepare_output(cfg, overwrite, move_aside)
        pred_path = work / PREDICTIONS
        done = load_done(pred_path)
        pending = [r for r in rows if r.id not in done]
        log.info("%d questions: %d already done in %s, %d to go", len(rows), len(rows) - len(pending), pred_path,
                 len(pending))
        started = time.perf_counter()
        engine_stats: dict[str, dict[str, float]] = {}
        if pending:
            if "judge" in metrics and judge is None:
                from ..rewards.judge import JudgeClient

                judge = JudgeClient(cfg.judge)
                judge.check()  # fail fast, before anything heavy loads
            if policy is None and cfg.policy.type == "endpoint":
                from ..endpoints import api_key_from_env, check_endpoint

                check_endpoint(cfg.policy.base_url, api_key_from_env(cfg.policy.api_key_env), model=cfg.policy.model,
                               what="policy endpoint")
            if searcher is None:
                searcher = build_searcher(cfg)
                if searcher is not None:
                    probe_searcher(searcher, cfg.search.index)  # a dead search target stops the run here, not later
            from ..tools.build import build_tools

            # the search tool over it and the config's other tools, before the model loads (a broken one: one line)
            tools = build_tools(cfg.tools, searcher=searcher)
            try:
                tokenizer = tokenizer if tokenizer is not None else build_tokenizer(cfg)
                if policy is None and cfg.policy.type == "local":  # every question fits the model, before it loads
                    p = cfg.prompt
                    system = mode_system_prompt(cfg.mode, get_dialect(cfg.rollout.dialect), p.language,
                                                p.system_prompt)
                    schemas = tools.schemas()
                    check_prompt_lengths(
                        ((r.id, user_message(prompt_question(r), None, p.language)) for r in pending),
                        lambda q: build_prompt(tokenizer, q, cfg.rollout.dialect, language=p.language,
                                               chat=p.chat_template, system=system, tools=schemas),
                        context_length(cfg.policy.model), source=f"dataset.path {cfg.dataset.path}",
                        budget=cfg.rollout.max_completion_tokens)
                owned = policy is None
                policy = policy if policy is not None else build_policy(cfg, tokenizer)
            except BaseException:
                tools.close()
                raise
            engine = AgentRollout(policy, tokenizer, tools, mode_rollout(cfg.rollout, cfg.mode),
                                  search_timeout_s=cfg.search.timeout_s)
            size = cfg.batch_size
            bar = tqdm(total=len(rows), initial=len(rows) - len(pending), unit="q", desc=f"eval {cfg.name}",
                       disable=not progress)
            try:
                with open(pred_path, "a", encoding="utf-8") as f:
                    for b, start in enumerate(range(0, len(pending), size)):
                        batch = pending[start:start + size]
                        records = _run_batch(engine, tokenizer, cfg, batch, metrics, judge, build_prompt, RolloutHooks,
                                             searcher)
                        append_records(f, records)
                        for rec in records:
                            done[rec["id"]] = rec
                        bar.update(len(records))
                        cover = [r["metrics"].get("cover_em") for r in done.values()]
                        if cover and cover[0] is not None:
                            bar.set_postfix(cover_em=f"{sum(cover) / len(cover):.3f}")
                        if on_batch is not None:
                            on_batch(b, records)
            finally:
                bar.close()
                close = getattr(policy, "close", None)
                if owned and callable(close):
                    close()
                engine_stats = engine.tool_stats
                tools.close()
        if overwrite:
            finish_overwrite(out_dir)
        records = [done[r.id] for r in rows if r.id in done]
        summary = summarize(records, metrics)
        elapsed = time.perf_counter() - started
        summary.update({
            "run": cfg.name, "dataset": cfg.dataset.path, "metrics_requested": metrics,
            "policy": {k: getattr(cfg.policy, k) for k in ("type", "model", "adapter", "base_url")},
            "search": {"index": cfg.search.index, "retriever": cfg.search.retriever,
                       "k": cfg.rollout.passages_per_search},
            "dialect": cfg.rollout.dialect, "mode": cfg.mode,
            "this_session": {"examples": len(pending), "elapsed_s": round(elapsed, 3),
                             "questions_per_s": round(len(pending) / elapsed, 4) if pending and elapsed > 0 else None},
            "config": config_to_dict(cfg),
        })
        if judge is not None and hasattr(judge, "stats"):
            summary.setdefault("judge", {})["this_session_calls"] = dataclasses.asdict(judge.stats)
        failures = search_failures(records, cfg)
        summary["search_failures"] = failures
        summary["tools"] = tool_summary(records, engine_stats)
        atomic_write_text(out_dir / SUMMARY, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        if failures["over_threshold"]:
            raise SearchFailuresError(
                f"{failures['failed']} of {failures['searches']} searches failed ({failures['rate']:.1%}, over "
                f"search.max_failure_rate {failures['max_rate']:.1%}): the scores in {out_dir / SUMMARY} measure a "
                f"broken search target ({cfg.search.index}), not the model. Fix the searcher and run again with "
                f"--overwrite", summary)
        return summary



def tool_summary(records: list[dict[str, Any]], stats: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per tool: answered calls and failed calls per question over the records, and this session's calls and
    seconds spent in them (the engine's :attr:`~agentic_rag.rollout.engine.AgentRollout.tool_stats`)."""
    names = sorted({n for r in records for n in (*r.get("tool_calls", {}), *r.get("tool_failures", {}))} | set(stats))
    n = max(1, len(records))
    return {name: {"calls_per_question": round(sum(r.get("tool_calls", {}).get(name, 0) for r in records) / n, 4),
                   "failures": sum(r.get("tool_failures", {}).get(name, 0) for r in records),
                   "this_session_calls": int(stats.get(name, {}).get("calls", 0)),
                   "this_session_seconds": round(stats.get(name, {}).get("seconds", 0.0), 3)} for name in names}


def search_failures(records: list[dict[str, Any]], cfg: EvalConfig) -> dict[str, Any]:
    """How many of the run's searches failed (error observations instead of passages), against the threshold:
    every sample's searches, and ``naive_rag``'s search with the question. A closed-book run (``search.index:
    none``, or ``mode: direct``) has no search target to fail: never over the threshold, and ``not_counted`` says
    why (with ``index: none`` every search the model writes gets an error observation by design)."""
    failed = searches = 0
    for r in records:
        for s in r.get("samples") or [r]:
            failed += int(s.get("search_errors") or 0)
            # search queries carried out (records of earlier versions have only the search actions the model took)
            searches += int(s.get("searches_made", s.get("num_searches")) or 0)
        if isinstance(r.get("retrieval"), dict):
            searches += 1
            failed += int(bool(r["retrieval"].get("error")))
    rate = failed / searches if searches else 0.0
    closed_book = cfg.search.index == "none" or cfg.mode == "direct"
    out = {"failed": failed, "searches": searches, "rate": round(rate, 4), "max_rate": cfg.search.max_failure_rate,
           "over_threshold": (not closed_book) and failed > 0 and rate > cfg.search.max_failure_rate}
    if closed_book:
        why = "mode: direct" if cfg.mode == "direct" else "search.index: none"
        out["not_counted"] = (f"closed book ({why}): there is no search target, so a search the model writes "
                              f"(answered with an error observation, or refused) is no failure of the run")
    return out


def probe_searcher(searcher: Any, where: str) -> None:
    """One query through ``searcher`` before anything heavy loads; a :class:`~agentic_rag.errors.UserError`
    naming ``where`` (the index or URL) and the reason when it does not answer."""
    from ..search.probe import probe

    probe(searcher, where)


def _run_batch(engine, tokenizer, cfg: EvalConfig, batch: list[QARow], metrics: list[str], judge, build_prompt,
               hooks_cls, searcher: Any = None) -> list[dict[str, Any]]:
    """Roll out one batch of questions, each ``cfg.samples`` times (copies side by side in the engine's batch),
    with the prompts of ``cfg.mode`` (:mod:`.modes`); one record per question, made once all its samples are done."""
    from .modes import mode_system_prompt, retrieve, user_message

    p, n = cfg.prompt, cfg.samples
    questions = [prompt_question(row) for row in batch]
    passages: list[str | None] = [None] * len(batch)
    retrieval: list[dict[str, Any] | None] = [None] * len(batch)
    if cfg.mode == "naive_rag":
        found = retrieve(searcher, [row.question for row in batch], cfg.rollout.passages_per_search)
        for i, (row, (hits, error)) in enumerate(zip(batch, found, strict=True)):
            passages[i] = engine.observation_text(engine.dialect.format_passages(hits))
            retrieval[i] = {"query": row.question, "docids": [h.docid for h in hits],
                            "titles": [h.title for h in hits], "error": error}
    system = mode_system_prompt(cfg.mode, engine.dialect, p.language, p.system_prompt)
    schemas = engine.tools.schemas()
    prompts = [build_prompt(tokenizer, user_message(q, passages[i], p.language), cfg.rollout.dialect,
                            language=p.language, chat=p.chat_template, system=system, tools=schemas)
               for i, q in enumerate(questions)]
    rows = [{"question": row.question, "answers": list(row.answers), "id": row.id, **row.meta} for row in batch]
    copies = [i for i in range(len(batch)) for _ in range(n)]  # question i's samples are rows i*n .. i*n+n-1
    finished: dict[int, float] = {}
    t0 = time.perf_counter()

    def on_event(j: int, event: dict[str, Any]) -> None:
        if event.get("type") == "finish":
            finished[j] = time.perf_counter() - t0

    trajs = engine.run([prompts[i] for i in copies], [questions[i] for i in copies], hooks_cls(on_event=on_event),
                       rows=[rows[i] for i in copies])
    batch_time = time.perf_counter() - t0
    predicted = [prediction_of(t, cfg.mode, engine.dialect) for t in trajs]
    verdicts: list[Any] = [None] * len(trajs)
    if "judge" in metrics and judge is not None:
        from ..rewards.judge import JudgeItem

        items = [JudgeItem(questions[i], batch[i].answers, predicted[j][0]) for j, i in enumerate(copies)]
        verdicts = judge.judge_batch_detailed(items)
    records = []
    for i, row in enumerate(batch):
        first = i * n
        samples = [_sample(row, trajs[j], metrics, verdicts[j], predicted[j]) for j in range(first, first + n)] \
            if n > 1 else None
        records.append(_record(row, trajs[first], metrics, finished.get(first, batch_time), verdicts[first],
                               predicted[first], samples, retrieval[i]))
    return records
