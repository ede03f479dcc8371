"""Subcommands of evaluation: ``eval`` (run a config), ``score`` (re-score any predictions), ``eval-report``."""

from __future__ import annotations

import argparse
import json
import sys

from ..argtypes import positive_int
from ..outputs import add_move_aside
from .modes import MODES, mode_names


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
    samples = summary.get("samples")
    if samples:
        passed = " ".join(f"pass@{samples['n']}_{k}={v:.3f}" for k, v in samples["pass_at_n"].items() if v is not None)
        mixed = samples.get("mixed_share")
        print(f"{summary.get('run')}: {samples['n']} samples/question {passed}"
              + (f" mixed_share({samples['mixed_on']})={mixed:.3f}" if mixed is not None else ""), file=sys.stderr)


# the flags that run an evaluation without a YAML file -> the settings they set
SHORTCUTS = {"model": "policy.model", "adapter": "policy.adapter", "questions": "dataset.path",
             "index": "search.index", "output_dir": "output_dir", "limit": "dataset.limit", "samples": "samples",
             "mode": "mode"}


def eval_overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` and the shortcut flags, as overrides (the shortcuts after ``--set``: a named flag wins)."""
    return [*(args.set or []), *(f"{dotted}={getattr(args, dest)}" for dest, dotted in SHORTCUTS.items()
                                 if getattr(args, dest) is not None)]


def cmd_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..endpoints import EndpointError
    from ..errors import SearchFailuresError, UserError
    from ..settings import describe, read_yaml
    from .config import config_from_dict, resolve
    from .runner import run_evaluation

    data = read_yaml(args.config) if args.config else {}
    overrides = eval_overrides(args)
    if args.describe:
        cfg, loaded = resolve(data=data, source=args.config or "eval", overrides=overrides, check_files=False)
        print("\n".join(describe(cfg, loaded.origins)))
        return 0
    if not args.config and not (args.model and args.questions and (args.index or args.mode == "direct")):
        raise UserError("give --config FILE, or --model M --questions FILE --index DIR_OR_URL (and --adapter DIR, "
                        "--limit N, --out DIR, --samples N, --mode MODE as needed; --mode direct needs no index); "
                        "--describe lists every setting")
    name = Path(args.config).stem if args.config else Path(str(args.adapter or args.model)).name or "eval"
    cfg = config_from_dict(data, source=args.config or "eval", overrides=overrides, default_name=name)
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
    p.add_argument("--config", default=None, help="evaluation YAML (experiments/evaluation/*.yaml); without one, "
                                                  "--model, --questions and --index are enough")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="override a setting, e.g. --set rollout.max_searches=2 (repeatable; --describe lists them)")
    p.add_argument("--model", default=None, help="policy.model: the model (directory, .gguf, packaged name, hub name)")
    p.add_argument("--adapter", default=None, help="policy.adapter: a LoRA adapter (its trained settings apply)")
    p.add_argument("--questions", default=None, help="dataset.path: the question file")
    p.add_argument("--index", default=None, help="search.index: an index directory or a search server URL")
    p.add_argument("--output-dir", "--out", dest="output_dir", default=None, help="output_dir")
    p.add_argument("--limit", type=positive_int, default=None, help="dataset.limit: the first N questions")
    p.add_argument("--samples", type=positive_int, default=None,
                   help="samples: N rollouts per question at sampling.temperature (> 0 for N > 1): pass@N, the mean "
                        "over samples and the share of questions whose samples disagree")
    p.add_argument("--mode", default=None, choices=mode_names(),
                   help="mode: " + "; ".join(f"{name}: {text}" for name, text in MODES.items()))
    p.add_argument("--overwrite", action="store_true",
                   help="start over instead of resuming: the new run replaces the earlier results in output_dir once "
                        "it is complete (until then they stay as they were)")
    add_move_aside(p, "output_dir")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--describe", action="store_true",
                   help="print every setting (dotted name, value, help) as resolved from the defaults, the config "
                        "file, the adapter and the overrides, and exit; no model is loaded")
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
