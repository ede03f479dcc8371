"""Gold trajectories: scripted search turns played through the real rollout engine, for the SFT warm start.

``agentic-rag trajectories --questions FILE --index DIR --tokenizer MODEL --out FILE`` plays, for each question,
the turns an expert writes: one search a hop (``<search> query </search>`` in the agentic dialect, the dialect's
own search tags in another), then ``<answer> gold answer </answer>``. A scripted policy
(:class:`~agentic_rag.rollout.scripted.ScriptedPolicy`) emits them token by token through
:class:`~agentic_rag.rollout.engine.AgentRollout` against the real index, so prompts, observations, truncation and
masks are exactly what SFT, training and evaluation see. The hop queries come from the question file's
``hop_queries`` (the 2Wiki split files of :mod:`agentic_rag.data.wiki` carry them) or, for a 2Wiki file without
them, from :func:`agentic_rag.data.wiki.hops`.

Output: one JSON line a trajectory, token level (``prompt_ids``, ``completion_ids``, ``env_mask``: what
``agentic-rag sft --data`` reads) with ``id``, ``question``, ``kind``, ``type``, ``answer``, the hop queries and
gold titles, the searches (query and the titles shown), ``finish_reason`` and ``text``; and ``OUT.settings.json``,
the rollout and prompt settings used (the format of an adapter's ``agentic_rag.json``, the prompt resolved), so the
SFT run can be given the same ones.

Stats (printed and returned): trajectories by kind; per hop i, the share of trajectories with an i-th hop whose i-th
search showed that hop's gold passage (its title among the search event's ``hits``: in the observation as kept
after truncation); and per kind, how often a gold answer (or an alias, normalised, as whole words) appears in some
observation (yes/no answers are not looked for: "yes" in a passage says nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..rewards.accuracy import normalize_answer
from .questions import QARow, _any_records, prompt_question, read_questions

SETTINGS_SUFFIX = ".settings.json"
CHUNK = 64  # questions played together (one engine run), and the progress bar's step


def play_scripts(rows: Sequence[dict[str, Any]], *, tokenizer, searcher, prompt_ids: Callable[[str], list[int]],
                 settings, progress: bool = False, chunk: int = CHUNK) -> list[Any]:
    """Play each row's ``turns`` (texts a model would write) for its ``question`` through the rollout engine;
    returns the finished :class:`~agentic_rag.rollout.trajectory.Trajectory` of each row, in order.

    ``prompt_ids(question)`` builds the prompt as training does; ``settings`` are the
    :class:`~agentic_rag.rollout.settings.RolloutSettings`. A scripted policy is keyed by the question as it reads
    back from the prompt's token ids and plays one script per question: a question asked several times takes
    several passes."""
    from tqdm import tqdm

    from ..rollout import AgentRollout
    from ..rollout.encoding import encode_text
    from ..rollout.protocol import get_dialect
    from ..rollout.scripted import ScriptedPolicy

    dialect = get_dialect(settings.dialect)

    def key(question: str) -> str:
        # the question as the prompt holds it: untrusted text, its dialect tags neutralized (prompts.messages_prompt)
        return tokenizer.decode(encode_text(tokenizer, dialect.neutralize(question)))

    trajs: list[Any] = [None] * len(rows)
    with tqdm(total=len(rows), desc="trajectories", unit="q", disable=not progress) as bar:
        for lo in range(0, len(rows), chunk):
            passes: list[list[int]] = []
            seen: dict[str, int] = {}
            for i in range(lo, min(lo + chunk, len(rows))):
                n = seen[rows[i]["question"]] = seen.get(rows[i]["question"], -1) + 1
                if n == len(passes):
                    passes.append([])
                passes[n].append(i)
            for members in passes:
                policy = ScriptedPolicy(tokenizer, {key(rows[i]["question"]): rows[i]["turns"] for i in members})
                with AgentRollout(policy, tokenizer, searcher, settings) as engine:
                    done = engine.run([prompt_ids(rows[i]["question"]) for i in members],
                                      [rows[i]["question"] for i in members])
                for i, t in zip(members, done, strict=True):
                    trajs[i] = t
                bar.update(len(members))
    return trajs


# ------------------------------------------------------------------------------------------------- questions

@dataclass
class GoldQuestion:
    """A question with what its gold trajectory does: the hop queries, their gold titles, the answer."""

    id: str
    question: str  # as the model is shown it
    answers: list[str]
    kind: str
    type: str | None
    hop_queries: list[str]
    hop_titles: list[str] = field(default_factory=list)

    @property
    def answer(self) -> str:
        return self.answers[0]


def _str_list(value: Any) -> list[str] | None:
    return [str(v) for v in value] if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def gold_questions(path: str | os.PathLike, limit: int | None = None) -> list[GoldQuestion]:
    """The questions of ``path`` (any question format :func:`~agentic_rag.data.questions.read_questions` reads)
    with their hops: the record's ``hop_queries`` / ``hop_titles`` / ``kind`` / ``type`` when it has them, else
    :func:`agentic_rag.data.wiki.hops` and its kind and type rules. A question without a gold answer or without a
    hop is an error naming it."""
    from .wiki import answer_kind, hops, wiki_type

    rows: list[QARow] = read_questions(path, limit=limit, require_answers=True)
    out = []
    for row, (line, record) in zip(rows, _any_records(path), strict=False):
        record = record if isinstance(record, dict) else {}
        queries, titles = _str_list(record.get("hop_queries")), _str_list(record.get("hop_titles"))
        if queries is None:
            chain = hops(row)
            queries, titles = [q for q, _ in chain], [t for _, t in chain]
        if not queries:
            raise ValueError(f"{path}:{line}: question {row.id} has no hop to search (no gold titles, no "
                             f"hop_queries)")
        titles = titles if titles is not None and len(titles) == len(queries) else []
        kind = record.get("kind") if isinstance(record.get("kind"), str) else answer_kind(row.question, row.answers)
        qtype = record.get("type") if isinstance(record.get("type"), str) else wiki_type(row)
        out.append(GoldQuestion(row.id, prompt_question(row), list(row.answers), kind, qtype, queries, titles))
    return out


def gold_turns(q: GoldQuestion, dialect) -> list[str]:
    """The expert's turns: a search a hop, then the gold answer, in ``dialect``'s format."""
    return [dialect.write_search(query) for query in q.hop_queries] + [dialect.write_answer(q.answer)]


# ------------------------------------------------------------------------------------------------- stats

def observations(t, tokenizer) -> list[str]:
    """The text of each search observation of trajectory ``t`` (environment segments), as the model saw it."""
    from ..rollout.trajectory import ENV, OBSERVATION

    return [tokenizer.decode(t.completion_ids[s.start:s.end], skip_special_tokens=False)
            for s in t.segments if s.source == ENV and s.kind == OBSERVATION]


def searches(t) -> list[dict[str, Any]]:
    """Each search event of ``t``: its queries and the titles it showed (in the observation as kept)."""
    from ..rollout.events import search_events

    return [{"queries": e["queries"], "shown": [h["title"] for r in e.get("results", []) for h in r.get("hits", [])]}
            for e in search_events(t.events)]


def gold_hits(q: GoldQuestion, t) -> list[bool]:
    """Per hop of ``q`` (with a gold title): did the trajectory's search of that rank show the hop's gold passage."""
    done = searches(t)
    return [i < len(done) and title in done[i]["shown"] for i, title in enumerate(q.hop_titles)]


def answer_visible(q: GoldQuestion, texts: Sequence[str]) -> bool | None:
    """A gold answer (or alias) in some observation, normalised, as whole words; None for a yes/no answer."""
    golds = [g for g in (normalize_answer(a) for a in q.answers) if g]
    if not golds or golds[0] in ("yes", "no"):
        return None
    seen = normalize_answer(" ".join(texts))
    return any(re.search(rf"(?<!\w){re.escape(g)}(?!\w)", seen) for g in golds)


def trajectory_stats(golds: Sequence[GoldQuestion], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary of written trajectory records (see the module docstring)."""
    hop_n: Counter[int] = Counter()
    hop_hit: Counter[int] = Counter()
    vis_n: Counter[str] = Counter()
    vis: Counter[str] = Counter()
    for q, r in zip(golds, rows, strict=True):
        for i, hit in enumerate(r["gold_hits"]):
            hop_n[i + 1] += 1
            hop_hit[i + 1] += hit
        if r["answer_visible"] is not None:
            vis_n[q.kind] += 1
            vis[q.kind] += r["answer_visible"]
    return {"trajectories": len(rows), "by_kind": dict(Counter(q.kind for q in golds)),
            "by_type": dict(Counter(q.type or "unknown" for q in golds)),
            "gold_hit_by_hop": {str(i): round(hop_hit[i] / hop_n[i], 3) for i in sorted(hop_n)},
            "hop_counts": {str(i): hop_n[i] for i in sorted(hop_n)},
            "answer_visible_by_kind": {k: round(vis[k] / vis_n[k], 3) for k in sorted(vis_n)},
            "finish_reasons": dict(Counter(r["finish_reason"] for r in rows)),
            "not_ending_as_scripted": sum(1 for r in rows if not r["answered_as_scripted"]),
            "mean_completion_tokens": round(sum(len(r["completion_ids"]) for r in rows) / max(len(rows), 1), 1)}


# ------------------------------------------------------------------------------------------------- the command

def make_trajectories(golds: Sequence[GoldQuestion], *, tokenizer, searcher, rollout, prompt,
                      progress: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Play the gold trajectories of ``golds``; returns the output records and the stats."""
    from ..rollout.engine import tool_schemas
    from ..rollout.protocol import get_dialect
    from .prompts import build_prompt

    dialect = get_dialect(rollout.dialect)
    system = prompt.system_prompt or None

    schemas = tool_schemas(searcher)

    def prompt_ids(question: str) -> list[int]:
        return build_prompt(tokenizer, question, dialect, language=prompt.language, chat=prompt.chat_template,
                            system=system, tools=schemas)

    scripts = [{"question": q.question, "turns": gold_turns(q, dialect)} for q in golds]
    trajs = play_scripts(scripts, tokenizer=tokenizer, searcher=searcher, prompt_ids=prompt_ids, settings=rollout,
                         progress=progress)
    records = []
    for q, t in zip(golds, trajs, strict=True):
        records.append({
            "id": q.id, "question": q.question, "kind": q.kind, "type": q.type, "answer": q.answer,
            "hop_queries": q.hop_queries, "hop_titles": q.hop_titles, "searches": searches(t),
            "gold_hits": gold_hits(q, t), "answer_visible": answer_visible(q, observations(t, tokenizer)),
            "answered_as_scripted": t.answer is not None and t.answer.strip() == q.answer.strip(),
            "finish_reason": t.finish_reason, "prompt_ids": t.prompt_ids, "completion_ids": t.completion_ids,
            "env_mask": t.env_mask, "text": t.text})
    return records, trajectory_stats(golds, records)


def settings_path(out: str | os.PathLike) -> Path:
    """The sidecar holding the settings the trajectories of ``out`` were made with."""
    return Path(f"{out}{SETTINGS_SUFFIX}")


def settings_json(rollout, prompt, tools: list[Any] | None = None) -> str:
    """The settings sidecar: the format of an adapter's ``agentic_rag.json`` (``written_by: trajectories``)."""
    from ..rollout.trained_settings import FORMAT

    data = {"format": FORMAT, "written_by": "trajectories", "rollout": dataclasses.asdict(rollout),
            "prompt": dataclasses.asdict(prompt)}
    if tools is not None:
        data["tools"] = list(tools)
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def run_trajectories(args: argparse.Namespace, flags: dict[str, str]) -> dict[str, Any]:
    """``agentic-rag trajectories``: check everything, play, write the trajectories and the settings sidecar."""
    from ..errors import input_dir, input_file
    from ..models import load_tokenizer, model_problem
    from ..outputs import atomic_write_text, check_output_file
    from ..rollout.trained_settings import SavedSettings, resolved_prompt
    from ..search import open_searcher
    from ..settings import flag_overrides, load
    from ..tools.build import build_tools

    saved, _ = load(SavedSettings, env={}, overrides=flag_overrides(args, flags) + list(args.set),
                    source="trajectories")
    input_file(args.questions, "--questions", what="question file")
    if not str(args.index).startswith(("http://", "https://")):
        input_dir(args.index, "--index", what="index folder")
    if problem := model_problem(args.tokenizer, kind="tokenizer"):
        raise ValueError(f"--tokenizer: {problem}")
    inputs = {"--questions": args.questions, "--index": args.index, "--tokenizer": args.tokenizer}
    out = check_output_file(args.out, inputs)
    sidecar = check_output_file(settings_path(out), inputs, flag="--out (its settings file)")
    golds = gold_questions(args.questions, args.limit)
    tokenizer = load_tokenizer(args.tokenizer)
    prompt = resolved_prompt(saved.prompt, saved.rollout.dialect, tokenizer)
    tools = build_tools(saved.tools, searcher=open_searcher(args.index))
    t0 = time.perf_counter()
    try:
        records, stats = make_trajectories(golds, tokenizer=tokenizer, searcher=tools, rollout=saved.rollout,
                                           prompt=prompt, progress=len(golds) >= CHUNK)
    finally:
        tools.close()
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    atomic_write_text(sidecar, settings_json(saved.rollout, prompt, saved.tools))
    return {**stats, "seconds": round(time.perf_counter() - t0, 1), "path": str(out), "settings": str(sidecar)}
