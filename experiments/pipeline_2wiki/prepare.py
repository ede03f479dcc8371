"""Prepare the quick start's pipeline on a real corpus: 2WikiMultiHopQA passages and questions.

Writes under OUT: ``train.jsonl`` / ``dev.jsonl`` (disjoint slices of the 500 dev questions, generic format),
``init/`` (a tiny random-init Qwen2 model with the real Qwen2 tokenizer from ../shared/data) and
``sft_data.jsonl`` (expert trajectories played through the rollout engine against the real index: search
the question, then answer with the gold answer). The prompt is the quick start's: a one-line instruction as
plain text (a base-model prompt, as R1-Searcher trains), so sequences stay short enough for 2 CPU cores.

    python experiments/pipeline_2wiki/prepare.py --data ../shared/data --index OUT/index --out OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentic_rag.data.prompts import build_prompt
from agentic_rag.data.questions import read_questions
from agentic_rag.demo.experts import write_expert_trajectories
from agentic_rag.demo.tiny import TinyModelSize, init_tiny_model
from agentic_rag.models import load_tokenizer
from agentic_rag.rollout import RolloutSettings
from agentic_rag.search import open_searcher

SYSTEM_PROMPT = "Answer the question by searching."  # as in grpo.yaml and eval.yaml
LIMITS = RolloutSettings(max_turns=3, max_searches=2, max_tokens_per_turn=48, max_completion_tokens=256,
                       passages_per_search=1, max_observation_tokens=96)  # as in grpo.yaml and eval.yaml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="the shared data directory")
    ap.add_argument("--index", required=True, help="the 2Wiki index directory")
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=200, help="training questions")
    ap.add_argument("--dev", type=int, default=50, help="held-out questions")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_questions(Path(args.data) / "tts-project" / "2wikimultihopqa_dev500.json")
    dev, train = rows[:args.dev], rows[args.dev:args.dev + args.train]
    for name, part in (("dev", dev), ("train", train)):
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for r in part:
                f.write(json.dumps({"id": r.id, "question": r.question, "answers": r.answers,
                                    "supporting_facts": r.gold_titles}, ensure_ascii=False) + "\n")
    tok = load_tokenizer(str(Path(args.data) / "rtp-llm-qwen-tokenizer" / "qwen2_tokenizer"))
    init_tiny_model(tok, out / "init", size=TinyModelSize(hidden_size=128, layers=4, heads=4, intermediate_size=256,
                                                          max_positions=1024))
    experts = [{"question": r.question, "answer": r.answers[0], "kind": "search_then_answer",
                "turns": [f"<search> {r.question} </search>", f"<answer> {r.answers[0]} </answer>"]}
               for r in train]
    info = write_expert_trajectories(
        experts, out / "sft_data.jsonl", tokenizer=tok, searcher=open_searcher(args.index),
        prompt_ids=lambda q: build_prompt(tok, q, "agentic", chat=False, system=SYSTEM_PROMPT), settings=LIMITS)
    print(json.dumps({"train": len(train), "dev": len(dev), "experts": info}))


if __name__ == "__main__":
    main()
