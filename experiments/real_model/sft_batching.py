"""The quick start's SFT batched one way or the other (random or by length), and GRPO from it.

    python experiments/real_model/sft_batching.py --quickstart outputs/qs_w1 --world-seed 1 \
        --out outputs/qs_w1_rand [--batches random|by_length] [--seeds 0] [--controls]

Takes the world and the BM25 index of a finished quick start (``--quickstart``), trains the quick start's own LoRA
SFT (``quickstart.sft``: the same 400 expert trajectories, rate, batch of 8, seed, one epoch) with ``--batches``, then
measures it as the quick start measures its SFT start (greedy held-out EM; sampled two-hop behaviour: two-search
rate, entropy) and trains GRPO from it for each ``--seeds`` (and, with ``--controls``, the shuffled-reward control)
with the quick start's own functions and training config, each evaluated greedily on the held-out questions.
Every step is skipped when its output is already in ``--out``. The last line printed is one JSON object. From a
``--tiny`` quick start (a smoke run of this script) it trains the tiny model's SFT instead, as that quick start did.

Why: TRL's SFT loss is a mean over each batch's trained tokens, so batched by length the long (two-search)
trajectories' tokens weigh less (experiments/real_model/README.md, "The SFT's batching").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from agentic_rag.demo import quickstart as qs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quickstart", type=Path, required=True, help="a finished real-model quick start's directory")
    ap.add_argument("--world-seed", type=int, required=True, help="the world seed that quick start was made with")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", default="0", help="GRPO seeds, comma-separated ('' for none)")
    ap.add_argument("--controls", action="store_true", help="also the shuffled-reward control of each seed")
    ap.add_argument("--batches", choices=qs.SFT_BATCHES, default="random",
                    help="the SFT's batches (default random; the quick start's before 2026-11-23: by_length)")
    ap.add_argument("--sft-examples", type=int, default=None,
                    help="expert trajectories drawn for the SFT (default: the quick start's, 400 for the real model, "
                         "all for the tiny one); a handful for a smoke run")
    ap.add_argument("--behaviour-samples", type=int, default=qs.Settings.behaviour_samples,
                    help="sampled rollouts of each held-out two-hop question (default: the quick start's, "
                         f"{qs.Settings.behaviour_samples})")
    args = ap.parse_args()
    src = args.quickstart.resolve()
    if not (src / "world" / "test.jsonl").is_file() or not (src / "index" / "manifest.json").is_file():
        ap.error(f"{src} holds no quick start world and index: run the quick start first")
    saved = json.loads((src / "settings.json").read_text()) if (src / "settings.json").is_file() else {}
    if saved.get("tiny") and args.batches != "random":
        ap.error(f"{src} is a --tiny quick start: the tiny model's SFT always batches at random")
    os.environ.setdefault("AGENTIC_RAG_JVM_HEAP", qs.JVM_HEAP)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in ("world", "index"):
        if not (out / name).exists():
            shutil.copytree(src / name, out / name, symlinks=True)
    seeds = [int(x) for x in args.seeds.split(",") if x]
    # the SFT as the quick start made it (the tiny model's: every weight, batched at random), batched as asked
    s = qs.Settings.from_dir(src, out=out, seeds=seeds, world_seed=args.world_seed, workers=1,
                             sft_batches=args.batches)
    if args.sft_examples is not None:
        s.sft_examples = args.sft_examples
    s.behaviour_samples = args.behaviour_samples

    if not (out / "sft" / "sft_summary.json").exists():
        started = time.perf_counter()
        qs.sft(s, qs.build_model(s))
        summary = json.loads((out / "sft" / "sft_summary.json").read_text())
        summary["sft_s"] = round(time.perf_counter() - started, 1)
        (out / "sft" / "sft_summary.json").write_text(json.dumps(summary, indent=1))
    base, adapter = qs.models_of(s, out / "sft")
    result = {"sft_s": json.loads((out / "sft" / "sft_summary.json").read_text()).get("sft_s"),
              "sft_greedy_em": qs.evaluate(s, "sft", base, adapter)["metrics"]["em"],
              "sft_sampled_two_hop": qs.sampled_behaviour(s, base, adapter), "runs": {}}
    for seed in s.seeds:
        for control in (False, True) if args.controls else (False,):
            run_dir = qs.grpo(s, out / "sft", seed, control)
            ev = qs.evaluate(s, run_dir.name, base, run_dir / "final")
            result["runs"][run_dir.name] = {"em": ev["metrics"]["em"], "searches_per_question":
                                            ev["searches_per_question"], **qs.training_curves(run_dir)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
