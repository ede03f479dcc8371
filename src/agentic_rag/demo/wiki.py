"""The quick start's wiki task: real 2WikiMultiHopQA questions over a real Wikipedia corpus (issue 31).

    bash script/quickstart.sh --task wiki [--seeds N] [--out DIR] [--steps N] [--tiny] [--questions N]
                                          [--sft-cpu-autocast auto|bf16|none]

The same pipeline as the fictional world's (:mod:`agentic_rag.demo.quickstart`), on the 2Wiki files of
``../shared/data`` (:mod:`agentic_rag.data.wiki` says how each piece is made). Each step is skipped when its output
is complete, so a second run (or one after a crash) goes on where the last one stopped:

1. the corpus (HippoRAG's 2Wiki passages plus sampled480's context paragraphs: 8,651) and its BM25 index;
2. the splits: 764 training questions (sampled480 + the head of dev500), 200 validation questions (the tail of
   dev500, none repeating a training question); every number below is on the validation split;
3. gold trajectories of the training questions (one search a hop, then the gold answer) played through the real
   engine and index (:func:`agentic_rag.data.trajectories.make_trajectories`), with per-hop gold-hit rates;
4. baselines, Search-R1's Table 2 in miniature: the base model closed book (``direct``), with the question's
   passages in its prompt (``naive_rag``), both scored on the plain reply where it wrote no answer tag, and prompted
   as an agent with the dialect's full instructions (scored on its answer tag alone: "formed" is its format rate);
5. LoRA SFT on the gold trajectories (checkpointed: an interrupted SFT resumes; on a CPU with native bf16 under
   bf16 autocast, ``--sft-cpu-autocast``), then the SFT model greedy, and
   sampled (``--samples``, 4 rollouts) on the first 32 multi-hop validation questions: what GRPO has to work with;
6. per seed, GRPO from the SFT adapter (``resources/configs/wiki_grpo_smollm2_best.yaml``, the best measured
   recipe; ``--fast``: ``wiki_grpo_smollm2.yaml``; greedy validation EM in the log every few steps) and its
   shuffled-reward control (judged by its final evaluation alone);
7. every run on the validation split, the first seed's GRPO adapter and the SFT adapter also with search switched
   off and, with ``--random-passages``, with a searcher returning random passages (the GRPO gain must vanish: the
   two rows meet), and, with
   ``--hotpotqa``, the SFT and GRPO adapters on ``amor-hotpotqa/hotpotqa_dev.jsonl`` over an index of its own
   paragraphs (never trained on);
8. the table (EM, F1, searches per question, EM per kind and per 2Wiki type), ``summary.json``,
   ``reward_curve.png`` and one SwanLab dashboard with every run.

``summary.json`` keeps the world task's keys and adds ``model``, ``index`` and ``adapters`` (``sft``; ``grpo`` and
``control``, one per seed), so any adapter can be evaluated again with ``agentic-rag eval --adapter``.
``--tiny`` runs it all with a tiny Qwen2 model made from scratch (every weight of it SFT-trained), in minutes.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .console import eval_progress
from .quickstart import (
    CONFIGS,
    JVM_HEAP,
    SYSTEM_PROMPT,
    Settings,
    _done,
    _step,
    models_of,
    native_room,
    prepare_model,
    train_run,
)
from .report import _mean, dashboard, plot, reward_curve, row, training_curves

WIKI_CONFIG = CONFIGS / "wiki_grpo_smollm2.yaml"  # --fast: 128-token observations, EM, 4 steps (72 min on 2 cores)
WIKI_BEST_CONFIG = CONFIGS / "wiki_grpo_smollm2_best.yaml"  # the default: the best measured recipe
# what each recipe costs, said before it starts: both timed from a fresh clone with /usr/bin/time -v
# (experiments/wiki/README.md)
WIKI_CLOCK = {False: "1 h 48 min on 2 CPU cores (a Xeon with AMX), from a fresh clone (2026-12-07; a 16-step run "
                     "took about 4 min on an H200). --fast: 72 min on 2 cores",
              True: "72 min on 2 CPU cores, from a fresh clone (2026-11-27)"}
KIND_ORDER = ("yes_no", "pick_one", "multi_hop")
TYPE_ORDER = ("comparison", "bridge_comparison", "compositional", "inference")


@dataclass
class WikiSettings(Settings):
    """The quick start's settings with the wiki task's own: ``questions`` keeps the first N training and
    validation questions (a smoke run; the full splits are 764 and 200), ``hotpotqa`` adds the unseen-dataset
    rows, ``ablations`` the search-off rows (the GRPO and SFT adapters with no search tool), ``random_passages``
    the random-passage rows too (the same adapters searching an index that returns random passages: 9.5 more minutes
    on 2 cores, which took the quick start past its 90)."""

    questions: int | None = None
    hotpotqa: bool = False
    ablations: bool = True
    random_passages: bool = False
    data_dir: str | None = None  # the shared data (default ../shared/data, or AGENTIC_RAG_SHARED_DATA)
    sft_batch_size: int = 8
    sft_group_by_length: bool = True
    # the real model's SFT under bf16 autocast where the CPU computes it natively (AVX512-BF16, AMX; fp32 elsewhere):
    # 1187 s against 2350 s in fp32 in the quick start on the 2-core machine, its adapter 0.02 EM below fp32's on the
    # validation split (4 of 200 questions; experiments/wiki/README.md). "none" gives the fp32 adapter (the older table)
    sft_cpu_autocast: str = "auto"
    behaviour_questions: int = 32  # multi-hop validation questions the SFT model is sampled on (4 rollouts each)
    # False (default): the best measured recipe (wiki_grpo_smollm2_best.yaml); True: the 72-minute one (--fast)
    fast: bool = False

    def __post_init__(self) -> None:
        from ..training.machine import CPU_AUTOCAST

        super().__post_init__()
        if self.sft_cpu_autocast not in CPU_AUTOCAST:
            raise ValueError(f"sft_cpu_autocast must be one of {CPU_AUTOCAST}, got {self.sft_cpu_autocast!r}")

    @classmethod
    def for_tiny(cls, **kw: Any) -> WikiSettings:
        kw.setdefault("workers", 2)
        kw.setdefault("fast", True)  # a pipeline check: the short recipe
        return cls(tiny=True, model="", sft_epochs=10, sft_learning_rate=1e-3, **kw)

    @property
    def train_config(self) -> Path:
        return WIKI_CONFIG if self.fast else WIKI_BEST_CONFIG

    @property
    def native_recipe(self) -> dict[str, Any]:
        """No overrides: the wiki config's own rate (1e-4) in both formats."""
        return {}

    @property
    def train_file(self) -> Path:
        return self.out / "data" / "train.jsonl"

    @property
    def validation_file(self) -> Path:
        return self.out / "data" / "validation.jsonl"

    @property
    def index_dir(self) -> Path:
        return self.out / "index"


def _rollout(s: WikiSettings):
    import dataclasses

    from ..training.config import load_config

    rollout = load_config(s.train_config, env={}, check_files=False).rollout
    return dataclasses.replace(rollout, dialect=s.dialect, **(native_room(rollout) if s.dialect == "native" else {}))


def _prompt(s: WikiSettings, system_prompt: str | None = SYSTEM_PROMPT):
    from ..rollout.settings import PromptSettings

    return PromptSettings(system_prompt=system_prompt or "", chat_template=s.chat)


def _keep_first(path: Path, n: int | None) -> int:
    """Cut a JSONL file to its first ``n`` lines (None: keep all); returns the lines kept."""
    from ..outputs import atomic_write_text

    lines = path.read_text().splitlines(keepends=True)
    if n is not None and n < len(lines):
        lines = lines[:n]
        atomic_write_text(path, "".join(lines))
    return len(lines)


# ---------------------------------------------------------------------------------------------- steps

def build_task(s: WikiSettings) -> dict[str, Any]:
    """The corpus, its BM25 index and the splits (cut to ``--questions``); returns their counts."""
    from ..data.wiki import build_wiki_corpus, write_splits
    from ..search.build import build_index

    info_path = s.out / "data" / "task.json"
    if _done(info_path) and _done(s.index_dir / "manifest.json"):
        return json.loads(info_path.read_text())
    corpus = build_wiki_corpus(s.out / "data" / "corpus.jsonl", s.data_dir)
    splits = write_splits(s.out / "data", s.data_dir)
    kept = {"train": _keep_first(s.train_file, s.questions), "validation": _keep_first(s.validation_file, s.questions)}
    build_index(s.out / "data" / "corpus.jsonl", s.index_dir, bm25=True, progress=False)
    info = {"corpus": corpus, "splits": splits, "kept": kept}
    info_path.write_text(json.dumps(info, indent=1))
    return info


def task_texts(s: WikiSettings) -> list[str]:
    """What the task shows the model (passages, questions, the prompts and tags), for the tiny model's vocabulary."""
    from ..evaluation.modes import MODE_PROMPTS, mode_system_prompt
    from ..rollout.protocol import get_dialect

    d = get_dialect("agentic")
    texts = [json.loads(line)["contents"] for line in open(s.out / "data" / "corpus.jsonl")]
    for path in (s.train_file, s.validation_file):
        texts += [json.loads(line)["question"] for line in open(path)]
    texts += [SYSTEM_PROMPT, d.system_prompt("en"), *(mode_system_prompt(m, d, "en", "") or "" for m in MODE_PROMPTS),
              "User: Assistant: Passages:",
              "(1) No new results. No results."]
    texts += [t for tag in d.tool_tags for t in (tag.open, tag.close)]
    return texts


def build_model(s: WikiSettings) -> str:
    return prepare_model(s, lambda: task_texts(s), 0)


def trajectories(s: WikiSettings, init: str, *, questions: Path | None = None,
                 out: Path | None = None) -> dict[str, Any]:
    """The gold trajectories of the training questions, and their settings sidecar (what ``agentic-rag sft`` reads);
    resumable. ``questions`` and ``out``: other questions, each played with its own ``hop_queries`` and answer
    (default the training file), and output file (default ``OUT/sft_data.jsonl``; the stats beside it)."""
    from ..data.trajectories import gold_questions, make_trajectories, settings_json, settings_path
    from ..models import load_tokenizer
    from ..outputs import atomic_write_text
    from ..rollout.trained_settings import resolved_prompt
    from ..search import open_searcher

    out = out or s.out / "sft_data.jsonl"
    stats_path = out.with_name(f"{out.stem}.stats.json")
    if _done(stats_path) and _done(out):
        return json.loads(stats_path.read_text())
    tok = load_tokenizer(init)
    rollout = _rollout(s)
    prompt = resolved_prompt(_prompt(s), rollout.dialect, tok)
    records, stats = make_trajectories(gold_questions(questions or s.train_file), tokenizer=tok,
                                       searcher=open_searcher(s.index_dir), rollout=rollout, prompt=prompt)
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    atomic_write_text(settings_path(out), settings_json(rollout, prompt))
    stats_path.write_text(json.dumps(stats, indent=1))
    return stats


def sft(s: WikiSettings, init: str, *, data: Path | None = None, out: Path | None = None, seed: int = 0) -> Path:
    """LoRA SFT on the gold trajectories (every weight of the tiny model); resumes an interrupted run. ``data`` and
    ``out``: other trajectories (default ``OUT/sft_data.jsonl``) and output directory (default ``OUT/sft``);
    ``seed``: the adapter's initialisation and the batches' order."""
    from ..training import sft as sft_module

    out = out or s.out / "sft"
    if _done(out / "sft_summary.json"):
        return out
    common = dict(model=init, data=str(data or s.out / "sft_data.jsonl"), output_dir=str(out), rollout=_rollout(s),
                  prompt=_prompt(s), epochs=s.sft_epochs, learning_rate=s.sft_learning_rate, seed=seed, resume=None,
                  gradient_checkpointing=not s.tiny, save_steps=10, progress=True)
    # the real model at batch 8 of ~600-token trajectories peaks at 2.0 GB with checkpointing, 8.2 GB without
    # (experiments/benchmarks/sft_memory.py, with agentic_rag.malloc's allocator setting)
    if s.tiny:
        summary = sft_module.run_sft(full=True, batch_size=16, logging_steps=1, **common)
    else:  # in a process of its own: the heap its bf16 steps grow would stay with the evaluations after it
        summary = sft_module.run_sft_apart(batch_size=s.sft_batch_size, lora_r=16, lora_alpha=32, logging_steps=1,
                                           group_by_length=s.sft_group_by_length, cpu_autocast=s.sft_cpu_autocast,
                                           **common)
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=1))
    return out


def evaluate(s: WikiSettings, name: str, model: str, adapter: Path | str | None, *, mode: str = "agent",
             system_prompt: str | None = SYSTEM_PROMPT, retriever: str = "bm25", index: Path | str | None = None,
             questions: Path | None = None, samples: int = 1) -> dict[str, Any]:
    """One evaluation run (resumable): greedy, or ``samples`` rollouts a question at temperature 1.
    ``system_prompt=None``: the dialect's full instructions (the prompted agent); ``""``: the mode's own."""
    from ..evaluation.config import DatasetSection, EvalConfig, PolicySection
    from ..evaluation.runner import run_evaluation
    from ..rollout.settings import SamplingSettings
    from ..search.settings import SearchSettings

    out = s.out / "eval" / name
    if _done(out / "summary.json"):
        return json.loads((out / "summary.json").read_text())
    cfg = EvalConfig(
        name=name, dataset=DatasetSection(path=str(questions or s.validation_file)),
        policy=PolicySection(type="local", model=str(model), adapter=str(adapter or ""), tokenizer=str(model),
                             device="cpu"),
        search=SearchSettings(index=str(index or s.index_dir), retriever=retriever), rollout=_rollout(s),
        prompt=_prompt(s, system_prompt), mode=mode, samples=samples,
        sampling=SamplingSettings(temperature=1.0 if samples > 1 else 0.0),
        # 128 rows decode at once: on 2 cores a decode step costs mostly reading the weights, so a wider batch is
        # nearly free (64 at once took 1.75x the time); the KV cache of 128 wiki rows is ~4 GB
        batch_size=128 if samples == 1 else 32, metrics=["em", "f1", "well_formed"], output_dir=str(out), seed=0)
    return run_evaluation(cfg, progress=False, overwrite=True, on_batch=eval_progress(name, cfg.dataset.path))


def _subset(s: WikiSettings, kind: str, limit: int | None = None) -> Path:
    """The (first ``limit``) validation questions of one kind, as a file of their own."""
    path = s.out / "data" / f"validation_{kind}{'' if limit is None else f'_first{limit}'}.jsonl"
    if not _done(path):
        lines = [line for line in open(s.validation_file) if json.loads(line)["kind"] == kind][:limit]
        path.write_text("".join(lines))
    return path


def hotpotqa_task(s: WikiSettings) -> tuple[Path, Path]:
    """``amor-hotpotqa/hotpotqa_dev.jsonl`` (100 questions, a dataset never trained on) and a BM25 index of its own
    paragraphs (each question's ten, one passage a title, sentences joined as HotpotQA writes them)."""
    from ..data.wiki import shared_data_dir
    from ..search.build import build_index

    src = Path(s.data_dir) if s.data_dir else shared_data_dir()
    questions = src / "amor-hotpotqa" / "hotpotqa_dev.jsonl"
    index = s.out / "hotpotqa" / "index"
    if _done(index / "manifest.json"):
        return questions, index
    passages: dict[str, str] = {}
    for line in open(questions):
        for title, sentences in json.loads(line)["context"]:
            passages.setdefault(title, "".join(sentences).strip())
    corpus = s.out / "hotpotqa" / "corpus.jsonl"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_text("".join(json.dumps({"id": f"hotpotqa-dev-{i}", "title": t, "text": x,
                                          "contents": f"{t}\n{x}"}, ensure_ascii=False) + "\n"
                              for i, (t, x) in enumerate(passages.items())))
    build_index(corpus, index, bm25=True, progress=False)
    return questions, index


# ----------------------------------------------------------------------------------------------- report

def kind_row(name: str, summary: dict[str, Any]) -> dict[str, Any]:
    """A table row with EM per kind and per 2Wiki type."""
    r = row(name, summary)
    for group, order in (("by_kind", KIND_ORDER), ("by_type", TYPE_ORDER)):
        for key in order:
            r[f"em_{key}"] = summary.get(group, {}).get(key, {}).get("metrics", {}).get("em")
    return r


def wiki_table(rows: list[dict[str, Any]]) -> str:
    # formed: the share that ended with an answer in the dialect's tags (the agent's format failures, apart from its
    # answers); closed book and naive RAG score a reply without the tags on its answer span, the agent does not
    cols = [("EM", "em"), ("F1", "f1"), ("formed", "well_formed"), ("srch/q", "searches"), ("yes/no", "em_yes_no"),
            ("pick1", "em_pick_one"),
            ("multi", "em_multi_hop"), ("comp", "em_comparison"), ("bridge", "em_bridge_comparison"),
            ("compos", "em_compositional"), ("infer", "em_inference")]
    head = f"{'model':<28}" + "".join(f"{c:>8}" for c, _ in cols)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = "".join(f"{r[k]:>8.3f}" if isinstance(r.get(k), int | float) else f"{'-':>8}" for _, k in cols)
        lines.append(f"{r['model']:<28}{cells}")
    return "\n".join(lines)


def check_settings(s: WikiSettings) -> None:
    """As the world's: an output directory holds one set of settings (adding seeds is fine)."""
    from . import quickstart

    quickstart.check_settings(s, extra={"task": "wiki", "questions": s.questions,
                                        "sft_batch_size": s.sft_batch_size,
                                        "sft_group_by_length": s.sft_group_by_length,
                                        "sft_cpu_autocast": s.sft_cpu_autocast,
                                        "behaviour_questions": s.behaviour_questions})


def _em(summary: dict[str, Any] | None, kind: str | None = None) -> float | None:
    if summary is None:
        return None
    if kind is None:
        return summary["metrics"]["em"]
    return summary.get("by_kind", {}).get(kind, {}).get("metrics", {}).get("em")


def run(s: WikiSettings) -> dict[str, Any]:
    from ..search.jvm import default_heap
    from ..training.monitoring import watch_hint

    default_heap(os.environ, JVM_HEAP)
    check_settings(s)
    if not s.tiny:
        recipe = "--fast: 128-token observations, EM reward, 4 GRPO steps" if s.fast else \
            "the best measured recipe: 256-token observations, token-F1 reward, 16 GRPO steps (--fast: the short one)"
        print(f"wiki quick start, {recipe}; {WIKI_CLOCK[s.fast]}", flush=True)
    t = _step("1-2. the 2Wiki corpus, its BM25 index and the train / validation splits")
    task = build_task(s)
    print(f"   {task['corpus']['total']} passages; {task['kept']['train']} training and "
          f"{task['kept']['validation']} validation questions ({time.perf_counter() - t:.0f} s)", flush=True)
    t = _step("a word-level tokenizer and a tiny Qwen2 model, from scratch" if s.tiny else f"the model: {s.model}")
    init = build_model(s)
    t = _step("3. gold trajectories of the training questions, through the real engine and index")
    stats = trajectories(s, init)
    print(f"   {stats['trajectories']} trajectories, gold passage found per hop {stats['gold_hit_by_hop']}, "
          f"answer visible by kind {stats['answer_visible_by_kind']} ({time.perf_counter() - t:.0f} s)", flush=True)
    t = _step("4. baselines on the validation split: closed book, naive RAG, the prompted agent")
    base_model = init if s.tiny else s.model
    baselines = {"Direct (closed book)": evaluate(s, "direct", base_model, None, mode="direct", system_prompt=""),
                 "naive RAG": evaluate(s, "naive_rag", base_model, None, mode="naive_rag", system_prompt=""),
                 "prompted agent": evaluate(s, "prompted", base_model, None, system_prompt=None)}
    for name, summ in baselines.items():
        print(f"   {name}: EM {_em(summ):.3f}, searches/q {summ['searches_per_question']:.2f}", flush=True)
    print(f"   ({time.perf_counter() - t:.0f} s)", flush=True)
    t = _step("5. SFT on the gold trajectories")
    sft_dir = sft(s, init)
    base, sft_adapter = models_of(s, sft_dir)
    before = evaluate(s, "sft", base, sft_adapter)
    multi = _subset(s, "multi_hop", s.behaviour_questions)
    behaviour = evaluate(s, "sft_sampled_multi_hop", base, sft_adapter, questions=multi, samples=s.behaviour_samples) \
        if multi.stat().st_size else None
    multi_em = _em(before, "multi_hop")
    multi_text = "none in the split" if multi_em is None else f"{multi_em:.3f}"
    print(f"   SFT greedy EM {_em(before):.3f} (multi-hop {multi_text}), searches/q "
          f"{before['searches_per_question']:.2f} ({time.perf_counter() - t:.0f} s)", flush=True)
    t = _step(f"6. GRPO from the SFT adapter and the shuffled-reward control, seeds {s.seeds}")
    # the runs validate every few steps; their common start is the SFT evaluation above and their end the evaluation
    # of final/ in step 7 (the same greedy rollouts on the same questions: validating them twice costs minutes)
    overrides = {"logging.validation_file": s.validation_file, "logging.validation_at_start": "false",
                 "logging.validation_at_end": "false"}
    dirs: dict[tuple[int, bool], Path] = {}
    for seed in s.seeds:
        for control in (False, True):
            name = f"seed{seed}-{'control' if control else 'grpo'}"
            # the control is judged by its final evaluation: no validation while it trains (a GRPO run's curve says
            # where it peaks)
            sets = {**overrides, "algorithm.shuffle_rewards": str(control).lower()}
            if control:
                sets["logging.validation_file"] = ""
            dirs[seed, control] = train_run(s, sft_dir, name, seed, sets)
    print(f"   ({time.perf_counter() - t:.0f} s)", flush=True)
    t = _step("7. every run on the validation split, and the ablations")
    results = {key: evaluate(s, d.name, base, d / "final") for key, d in dirs.items()}
    first = dirs[s.seeds[0], False] / "final"
    ablations = {}
    if s.ablations:
        # the SFT start under the same ablations: the GRPO gain vanishes when these rows match the GRPO ones
        ablations = {"GRPO, search off": evaluate(s, "ablation_search_off", base, first, index="none"),
                     "SFT, search off": evaluate(s, "ablation_sft_search_off", base, sft_adapter, index="none")}
        if s.random_passages:
            ablations.update({
                "GRPO, random passages": evaluate(s, "ablation_random", base, first, retriever="random"),
                "SFT, random passages": evaluate(s, "ablation_sft_random", base, sft_adapter, retriever="random")})
    hotpot: dict[str, Any] = {}
    if s.hotpotqa:
        questions, index = hotpotqa_task(s)
        hotpot = {"SFT": evaluate(s, "hotpotqa_sft", base, sft_adapter, questions=questions, index=index)}
        for seed in s.seeds:
            hotpot[f"GRPO seed {seed}"] = evaluate(s, f"hotpotqa_seed{seed}-grpo", base, dirs[seed, False] / "final",
                                                   questions=questions, index=index)
    print(f"   ({time.perf_counter() - t:.0f} s)", flush=True)
    rows = [kind_row(n, summ) for n, summ in baselines.items()] + [kind_row("SFT", before)]
    for seed in s.seeds:
        rows.append(kind_row(f"SFT + GRPO seed {seed}", results[seed, False]))
        rows.append(kind_row(f"control seed {seed}", results[seed, True]))
    rows += [kind_row(n, summ) for n, summ in ablations.items()]
    print(wiki_table(rows))
    if hotpot:
        print("HotpotQA dev (100 questions, an index of their own paragraphs):")
        print(wiki_table([kind_row(n, summ) for n, summ in hotpot.items()]))
    names = {(seed, c): f"{'control' if c else 'GRPO'} seed {seed}" for seed, c in dirs}
    curves = {names[j]: reward_curve(dirs[j]) for j in dirs}
    plot(curves, s.out / "reward_curve.png")
    # each run's greedy validation curve: the SFT evaluation at step 0, the run's own validations, the evaluation of
    # its final adapter at its last step
    validation = {names[j]: [eval_point(before, 0, "eval/sft"), *validation_curve(dirs[j]),
                             eval_point(results[j], len(curves[names[j]]), f"eval/{dirs[j].name}")] for j in dirs}
    log_dir = dashboard(s.out, {names[j]: dirs[j] for j in dirs},
                        evals={n: [p for p in curve if "source" in p] for n, curve in validation.items()})
    summary = {
        "task": "wiki",
        "seeds": s.seeds,
        "em_prompted": _em(baselines["prompted agent"]),
        "em_before": [_em(before)] * len(s.seeds),
        "em_after": [_em(results[seed, False]) for seed in s.seeds],
        "em_control": [_em(results[seed, True]) for seed in s.seeds],
        "em_multi_hop": {"before": _em(before, "multi_hop"),
                         "after": [_em(results[seed, False], "multi_hop") for seed in s.seeds],
                         "control": [_em(results[seed, True], "multi_hop") for seed in s.seeds]},
        "table": rows,
        "sft_sampled_two_hop": behaviour and {"questions": behaviour["n"], **behaviour.get("samples", {})},
        "reward_first5_last5": {k: [_mean(v[:5]), _mean(v[-5:])] for k, v in curves.items()},
        "training_curves": {names[j]: training_curves(dirs[j]) for j in dirs},
        "validation_curves": validation,
        "held_out_questions": task["kept"]["validation"],
        "trajectories": stats,
        "hotpotqa": {n: kind_row(n, summ) for n, summ in hotpot.items()},
        "settings": {"task": "wiki", "model": s.model or "tiny", "sft_epochs": s.sft_epochs,
                     "sft_learning_rate": s.sft_learning_rate, "grpo_config": s.train_config.name,
                     "grpo_steps": len(next(iter(curves.values()))), "questions": s.questions},
        "model": base,
        "index": str(s.index_dir),
        "validation_file": str(s.validation_file),
        "adapters": {"sft": str(sft_dir), "grpo": [str(dirs[seed, False] / "final") for seed in s.seeds],
                     "control": [str(dirs[seed, True] / "final") for seed in s.seeds]},
        "reward_curve": str(s.out / "reward_curve.png"),
        "swanlab_log_dir": str(log_dir),
    }
    (s.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    em0 = summary["em_before"][0]
    gains = ", ".join(f"{a - em0:+.3f}" for a in summary["em_after"])
    controls = ", ".join(f"{c - em0:+.3f}" for c in summary["em_control"])
    print(f"EM gain of GRPO over SFT per seed: {gains}; of the control: {controls}")
    print(f"re-evaluate an adapter: agentic-rag eval --model {base} --adapter {summary['adapters']['grpo'][0]} "
          f"--questions {s.validation_file} --index {s.index_dir} --out OUT")
    print(watch_hint(str(log_dir)))
    print(f"summary: {s.out / 'summary.json'}")
    from .results import render

    report = render(s.out)  # the plots and the paired claims with their intervals (agentic-rag report)
    print(f"report: {s.out / 'report.md'} (plots: {', '.join(Path(p).name for p in report['plots'])})")
    return summary


def eval_point(summary: dict[str, Any], step: int, source: str) -> dict[str, Any]:
    """An evaluation (``eval/<name>/summary.json``) as one point of a validation curve: the SFT start's at step 0,
    a run's final adapter's at its last step (the runs validate neither again)."""
    point = {"step": step, "eval/em": summary["metrics"]["em"], "eval/f1": summary["metrics"]["f1"],
             "eval/searches": summary["searches_per_question"]}
    for kind, value in summary.get("by_kind", {}).items():
        point[f"eval/em_{kind}"] = value["metrics"]["em"]
    return {**point, "source": source}


def validation_curve(run_dir: Path) -> list[dict[str, Any]]:
    """The run's greedy validation scores, one entry per validation (``OUTPUT_DIR/validation.jsonl``)."""
    path = run_dir / "validation.jsonl"
    if not path.exists():
        return []
    by_step = {}  # a run resumed from a checkpoint before its last validation validates that step again: keep the last
    for line in open(path):
        entry = json.loads(line)
        by_step[entry["step"]] = entry
    return [by_step[k] for k in sorted(by_step)]
