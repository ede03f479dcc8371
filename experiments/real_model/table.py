"""Agentic RAG-R1's results table for the real model: before fine-tuning, before fine-tuning with search, and
after fine-tuning with search (SFT, then SFT + GRPO), on the quick start world's held-out questions and on
2WikiMultiHopQA dev questions over the real 2Wiki corpus (BM25). Greedy decoding; EM, F1 and format rate.

    python experiments/real_model/table.py --quickstart outputs/quickstart [--seed 0] [--limit-2wiki 200]

Reads the quick start's outputs (its world, index, SFT adapter and the seed's GRPO adapter); builds the 2Wiki
BM25 index under outputs/indexes/2wiki when missing. Every fine-tuned row runs with the rollout settings it was
trained with (the quick start's training config: chat template, one-line system prompt, one passage per search,
64 observation tokens); the "before fine-tuning" rows use the dialect's full instructions, which explain the
tags, since the untuned model has never seen the one-line prompt. Writes ``table.json`` and ``table.md`` next to
this file (or ``--record DIR``); evaluations are resumable under OUT/eval_table. From a ``--tiny`` quick start (a
smoke run of this script, with ``--wiki-index`` a small index and ``--limit-world`` a few questions) the rows are the
tiny model's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CLOSED_BOOK_PROMPT = ("Answer the question. Give the final answer, a short phrase, once inside <answer> </answer>, "
                      "and write nothing after it.")


def rows_for(qs: Path, seed: int) -> list[dict[str, Any]]:
    """The table's rows for the quick start in ``qs``: the real model's (LoRA adapters on it, its chat template) or,
    for a ``--tiny`` quick start (its ``settings.json`` says; a smoke run of this script), the tiny model's (its
    random init before fine-tuning, its SFT a whole model, plain-text prompts, the trained limits throughout: the
    untuned limits do not fit its 512 positions)."""
    from agentic_rag.demo.quickstart import REAL_CONFIG, REAL_MODEL, SYSTEM_PROMPT, TINY_CONFIG

    saved = json.loads((qs / "settings.json").read_text()) if (qs / "settings.json").is_file() else {}
    tiny = bool(saved.get("tiny"))
    before = str(qs / "init") if tiny else REAL_MODEL
    tuned, sft_adapter = (str(qs / "sft"), "") if tiny else (REAL_MODEL, str(qs / "sft"))
    common = {"chat_template": not tiny, "config": str(TINY_CONFIG if tiny else REAL_CONFIG)}
    return [
        {"name": "before fine-tuning (no search)", "model": before, "adapter": "", "index": "none",
         "system_prompt": CLOSED_BOOK_PROMPT, "trained_limits": tiny, **common},
        {"name": "before fine-tuning, with search", "model": before, "adapter": "", "index": None,
         "system_prompt": "", "trained_limits": tiny, **common},
        {"name": "after SFT, with search", "model": tuned, "adapter": sft_adapter, "index": None,
         "system_prompt": SYSTEM_PROMPT, "trained_limits": True, **common},
        {"name": f"after SFT + GRPO (seed {seed}), with search", "model": tuned,
         "adapter": str(qs / "runs" / f"seed{seed}-grpo" / "final"), "index": None,
         "system_prompt": SYSTEM_PROMPT, "trained_limits": True, **common},
    ]


def evaluate(row: dict[str, Any], *, dataset: Path, limit: int | None, index: Path, out: Path) -> dict[str, Any]:
    import dataclasses

    from agentic_rag.evaluation.config import DatasetSection, EvalConfig, PolicySection
    from agentic_rag.evaluation.runner import run_evaluation
    from agentic_rag.rewards.registry import metric_value
    from agentic_rag.rollout.settings import PromptSettings, RolloutSettings
    from agentic_rag.search.settings import SearchSettings
    from agentic_rag.training.config import load_config

    if row["trained_limits"]:
        rollout = load_config(row["config"], env={}, check_files=False).rollout
    else:  # the untuned model: room to write, three passages a search (the evaluation defaults, shortened)
        rollout = RolloutSettings(max_turns=4, max_searches=3, max_tokens_per_turn=128, max_completion_tokens=768,
                                  max_observation_tokens=256, passages_per_search=3)
    rollout = dataclasses.replace(rollout)
    cfg = EvalConfig(name=out.name, dataset=DatasetSection(path=str(dataset), limit=limit),
                     policy=PolicySection(type="local", model=row["model"], adapter=row["adapter"], device="cpu"),
                     search=SearchSettings(index=row["index"] or str(index)), rollout=rollout,
                     prompt=PromptSettings(system_prompt=row["system_prompt"], chat_template=row["chat_template"]),
                     batch_size=32, metrics=["em", "f1", "well_formed"], output_dir=str(out), seed=0)
    summary = run_evaluation(cfg, progress=False)
    m = summary["metrics"]
    return {"em": m["em"], "f1": m["f1"], "well_formed": metric_value(m, "well_formed"),
            "searches": summary["searches_per_question"],
            "n": summary.get("n", summary.get("questions"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quickstart", default="outputs/quickstart", help="the quick start's output directory")
    ap.add_argument("--seed", type=int, default=0, help="the GRPO seed whose adapter is the last row")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="the shared data directory")
    ap.add_argument("--limit-2wiki", type=int, default=200, help="2Wiki dev questions (the first N of 500)")
    ap.add_argument("--record", default=str(Path(__file__).parent), help="where table.json / table.md go")
    ap.add_argument("--wiki-index", default=None,
                    help="a 2Wiki BM25 index to search (default: outputs/indexes/2wiki, built when missing)")
    ap.add_argument("--limit-world", type=int, default=None,
                    help="the first N of the world's held-out questions (default: all)")
    args = ap.parse_args(argv)
    from agentic_rag.logs import configure_logging
    from agentic_rag.search.build import build_index

    configure_logging("WARNING")
    qs = Path(args.quickstart).resolve()
    data = Path(args.data)
    if args.wiki_index:
        wiki_index = Path(args.wiki_index)
    else:
        wiki_index = ROOT / "outputs" / "indexes" / "2wiki"
        build_index(data / "hipporag" / "2wikimultihopqa_corpus.json", wiki_index, bm25=True, progress=False)
    datasets = {"world held-out": (qs / "world" / "test.jsonl", args.limit_world, qs / "index"),
                "2WikiMultiHopQA dev": (data / "tts-project" / "2wikimultihopqa_dev500.json", args.limit_2wiki,
                                        wiki_index)}
    results: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    for row in rows_for(qs, args.seed):
        results[row["name"]] = {}
        for ds, (path, limit, index) in datasets.items():
            tag = f"{ds.split()[0].lower()}-{rows_for(qs, args.seed).index(row)}"
            t = time.perf_counter()
            results[row["name"]][ds] = evaluate(row, dataset=path, limit=limit, index=index,
                                                out=qs / "eval_table" / tag)
            r = results[row["name"]][ds]
            print(f"{row['name']:<42} {ds:<20} EM {r['em']:.3f} F1 {r['f1']:.3f} well-formed {r['well_formed']:.3f} "
                  f"searches {r['searches']:.2f} ({time.perf_counter() - t:.0f} s)", flush=True)
    lines = ["| model | " + " | ".join(f"{ds} EM | F1 | well-formed" for ds in datasets) + " |",
             "|---|" + "---|---|---|" * len(datasets)]
    for name, per in results.items():
        cells = [f"{per[ds]['em']:.3f} | {per[ds]['f1']:.3f} | {per[ds]['well_formed']:.3f}" for ds in datasets]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    record = Path(args.record)
    record.mkdir(parents=True, exist_ok=True)
    (record / "table.json").write_text(json.dumps({"quickstart": str(qs.relative_to(ROOT)) if qs.is_relative_to(ROOT)
                                                   else str(qs), "command": " ".join(sys.argv),
                                                   "results": results, "limit_2wiki": args.limit_2wiki,
                                                   "seed": args.seed, "wall_s": time.perf_counter() - started},
                                                  indent=1) + "\n")
    (record / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
