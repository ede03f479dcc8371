"""How often a quick start's SFT start searches twice on two-hop questions when sampled at several temperatures.

    python experiments/real_model/sampling_temperature.py --quickstart outputs/qs_w1 --world-seed 1 \\
        --temperatures 1.0,1.3 --split train

Samples ``--samples`` rollouts of each of the first ``--questions`` two-hop questions of the split, with the
quick start's prompt and rollout limits, and prints one JSON line per temperature: the share of rollouts that
search twice, that answer right, that answer at all, and the share of questions with at least one right
sample (what GRPO's group needs to learn anything).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from agentic_rag.data.world import generate_world, questions
from agentic_rag.demo import quickstart as qs
from agentic_rag.models import load_causal_lm, load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quickstart", required=True,
                    help="a quick start's output directory (its sft/, index/ and settings.json: the real model's or "
                         "the tiny one's)")
    ap.add_argument("--world-seed", type=int, required=True)
    ap.add_argument("--temperatures", default="1.0,1.3")
    ap.add_argument("--split", choices=("train", "test"), default="train")
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--samples", type=int, default=4)
    args = ap.parse_args()
    out = Path(args.quickstart)
    s = qs.Settings.from_dir(out, world_seed=args.world_seed)  # the tiny model or the real one, as it was made
    train, test = questions(generate_world(args.world_seed))
    two_hop = [q for q in (train if args.split == "train" else test) if q["hops"] == 2][:args.questions]
    base, adapter = qs.models_of(s, out / "sft")
    tok = load_tokenizer(base)
    model = load_causal_lm(base, adapter=adapter or None, device="cpu")
    for temperature in (float(t) for t in args.temperatures.split(",")):
        torch.manual_seed(0)
        started = time.perf_counter()
        stats, trajs = qs.sample_two_hop(s, model, tok, two_hop, args.samples, temperature)
        print(json.dumps({
            "temperature": temperature, "rollouts": len(trajs), "two_searches_rate": stats["two_searches_rate"],
            "em_sampled": stats["em_sampled"], "answered": sum(t.answer is not None for t in trajs) / len(trajs),
            "questions_with_a_right_sample": stats["questions_with_a_right_sample"],
            "seconds": round(time.perf_counter() - started)}), flush=True)


if __name__ == "__main__":
    main()
