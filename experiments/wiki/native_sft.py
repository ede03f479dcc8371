"""The wiki task's SFT in the tag dialect and in the native tool-call format, side by side (issue 57, item 4).

    python experiments/wiki/native_sft.py --out /work/runs/wiki_native --train-questions 256
    python experiments/wiki/native_sft.py --out /work/runs/wiki_native --dialects native --sft-lr 1e-3

One 2Wiki task (the wiki quick start's corpus, index and splits, built once under OUT), the gold trajectories of the
first N training questions in each format (``agentic``: ``<search>`` tags; ``native``: SmolLM2 with the package's
ChatML tool template, ``<tool_call>`` JSON, results in the template's tool turn, the limits widened by
``native_room``), one LoRA SFT each with the wiki quick start's recipe, and a greedy evaluation of each adapter on the
200 validation questions. Each step is skipped when its output exists. Prints the table and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from agentic_rag.demo.quickstart import models_of
from agentic_rag.demo.wiki import WikiSettings, _em, build_model, build_task, evaluate, sft, trajectories
from agentic_rag.evaluation.paired import paired, predictions


def subset(path: Path, n: int, out: Path) -> Path:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)[:n]
    if not out.exists():
        out.write_text("".join(lines), encoding="utf-8")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-questions", type=int, default=256)
    ap.add_argument("--dialects", nargs="+", default=["agentic", "native"])
    ap.add_argument("--sft-lr", type=float, default=None, help="the SFT's learning rate (default the quick start's)")
    ap.add_argument("--sft-epochs", type=float, default=None,
                    help="the SFT's epochs (default the quick start's: 1, 10 with --tiny)")
    ap.add_argument("--questions", type=int, default=None,
                    help="the first N training and validation questions only (a smoke run; default all: 764 and 200)")
    ap.add_argument("--tiny", action="store_true",
                    help="the wiki quick start's tiny from-scratch model instead of SmolLM2 (a pipeline check whose "
                         "numbers mean nothing; the agentic dialect only: its tokenizer has no chat template)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    # the 128-token recipe it was recorded with
    s = WikiSettings.for_tiny(out=out, seeds=[0], questions=args.questions) if args.tiny else \
        WikiSettings(out=out, seeds=[0], fast=True, questions=args.questions)
    tag_name = ""
    if args.sft_lr is not None:
        s.sft_learning_rate, tag_name = args.sft_lr, f"_lr{args.sft_lr:g}"
    if args.sft_epochs is not None:
        s.sft_epochs = args.sft_epochs
        tag_name += f"_ep{args.sft_epochs:g}"
    build_task(s)
    init = build_model(s)
    train = subset(s.train_file, args.train_questions, s.out / f"train_first{args.train_questions}.jsonl")
    rows = {}
    for dialect in args.dialects:
        s.dialect = dialect
        started = time.perf_counter()
        data = s.out / f"sft_data_{dialect}.jsonl"
        stats = trajectories(s, init, questions=train, out=data)
        adapter_dir = sft(s, init, data=data, out=s.out / f"sft_{dialect}{tag_name}")
        base, adapter = models_of(s, adapter_dir)
        summary = evaluate(s, f"sft_{dialect}{tag_name}", base, adapter)
        sft_summary = json.loads((adapter_dir / "sft_summary.json").read_text())
        rows[dialect] = {"em": _em(summary), "em_multi_hop": _em(summary, "multi_hop"),
                         "f1": summary["metrics"].get("f1"), "well_formed": summary["metrics"].get("well_formed"),
                         "searches_per_question": summary["searches_per_question"],
                         "trajectories": stats["trajectories"], "mean_completion_tokens":
                             stats["mean_completion_tokens"], "sft_train_loss": sft_summary.get("train_loss"),
                         "seconds": round(time.perf_counter() - started, 1)}
        print(f"{dialect}: {rows[dialect]}", flush=True)
    print("| format | EM | multi-hop EM | F1 | well-formed | searches/q | completion tokens (gold) |")
    print("|---|---|---|---|---|---|---|")
    for dialect, r in rows.items():
        print(f"| {dialect} | {r['em']:.3f} | {r['em_multi_hop']:.3f} | {r['f1']:.3f} | {r['well_formed']:.3f} | "
              f"{r['searches_per_question']:.2f} | {r['mean_completion_tokens']:.0f} |")
    tag = s.out / "eval" / "sft_agentic"
    if (tag / "predictions.jsonl").exists():  # each native SFT against the tag dialect's, question by question
        multi_hop = lambda r: r.get("meta", {}).get("kind") == "multi_hop"  # noqa: E731
        for dialect, r in rows.items():
            if dialect != "agentic":
                mine, theirs = predictions(s.out / "eval" / f"sft_{dialect}{tag_name}"), predictions(tag)
                r["vs_tag"] = {"all": paired(mine, theirs), "multi_hop": paired(mine, theirs, where=multi_hop)}
                print(f"{dialect} against the tag dialect: {r['vs_tag']}")
    print(json.dumps({"train_questions": args.train_questions, "sft_learning_rate": s.sft_learning_rate,
                      "rows": rows}))


if __name__ == "__main__":
    main()
