"""Subcommands of evaluation: ``eval`` (run a config), ``score`` (re-score any predictions), ``eval-report``."""

from __future__ import annotations

import argparse
import json
import sys

from ..argtypes import positive_int
from ..outputs import add_move_aside


def _print_summary(summary: dict) -> None:
    metrics = summary.get("metrics") or {}
    parts = [f"{k}={v:.3f}" for k, v in metrics.items() if v is not None]
    lat = summary.get("latency_s") or {}
    fails = summary.get("search_failures") or {}
    print(f"{summary.get('run')}: n={summary.get('n')} " + " ".join(parts)
          + f" searches/q={summary.get('searches_per_question') or 0:.2f}"
          + (f" latency_p50={lat['p50']:.2f}s" if lat.get("p50") is not None else "")
          + (f" failed_searches={fails['failed']}/{fails['searches']}" if fails.get("failed") else ""),
          file=sys.stderr)


def cmd_eval(args: argparse.Namespace) -> int:
    from ..endpoints import EndpointError
    from ..errors import SearchFailuresError, UserError
    from .config import describe, load_eval_config
    from .runner import run_evaluation

    if args.describe:
        for name, default, help_ in describe():
            print(f"{name:32} {default:14} {help_}")
        return 0
    if not args.config:
        raise ValueError("give --config FILE (see --describe for every setting)")
    overrides = list(args.set or [])
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    if args.limit is not None:
        overrides.append(f"dataset.limit={args.limit}")
    cfg = load_eval_config(args.config, overrides=overrides)
    try:
        summary = run_evaluation(cfg, progress=not args.no_progress, overwrite=args.overwrite,
                                 move_aside=args.move_aside)
    except EndpointError as exc:
        raise UserError(str(exc)) from None
    except SearchFailuresError as exc:  # the summary is written; show it, then the failure as the last line
        _print_summary(exc.summary)
        raise
    except KeyboardInterrupt:
        print(f"interrupted: finished examples are in {cfg.output_dir}/predictions.jsonl; rerun the same command "
              f"to resume", file=sys.stderr)
        return 130
    _print_summary(summary)
    slim = {k: v for k, v in summary.items() if k != "config"}
    print(json.dumps({"output_dir": cfg.output_dir, **slim}))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from ..errors import input_file
    from .metrics import score_predictions

    input_file(args.predictions, "--predictions", what="JSONL prediction file (e.g. RUN_DIR/predictions.jsonl)")
    result = score_predictions(args.predictions, pred_field=args.pred_field, answer_field=args.answer_field)
    print(json.dumps({"file": str(args.predictions), **result}))
    return 0


def cmd_eval_report(args: argparse.Namespace) -> int:
    from .report import write_report

    out = write_report(args.runs, args.out, names=args.names)
    print(json.dumps({"report": str(out), "chart": str(out.with_suffix(".png"))}))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a policy (local model + adapter, or an OpenAI-compatible endpoint) "
                                    "on a dataset: per-example JSONL + summary JSON, resumable")
    p.add_argument("--config", default=None, help="evaluation YAML (experiments/evaluation/*.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a setting, e.g. --set policy.adapter=outputs/run/adapter (repeatable)")
    p.add_argument("--output-dir", default=None, help="override output_dir")
    p.add_argument("--limit", type=positive_int, default=None, help="override dataset.limit")
    p.add_argument("--overwrite", action="store_true",
                   help="start over instead of resuming: the new run replaces the earlier results in output_dir once "
                        "it is complete (until then they stay as they were)")
    add_move_aside(p, "output_dir")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--describe", action="store_true", help="list every config setting with its default and help")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("score", help="re-score any system's predictions (JSONL) with the project's normalisation: "
                                     "prints {n, em, f1, cover_em}")
    p.add_argument("--predictions", required=True, help="JSONL with a prediction and gold answer(s) per line")
    p.add_argument("--pred-field", default=None, help="prediction field (default: prediction, pred_ans, pred, ...)")
    p.add_argument("--answer-field", default=None,
                   help="gold field, a string or a list (default: gold, golden_answers, answers, answer)")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("eval-report", help="compare evaluation runs: markdown table + bar chart")
    p.add_argument("--runs", nargs="+", required=True, help="run output directories (or their summary.json)")
    p.add_argument("--names", nargs="+", default=None, help="display names, one per run")
    p.add_argument("--out", required=True, help="report markdown path; the chart goes next to it (.png)")
    p.set_defaults(func=cmd_eval_report)
