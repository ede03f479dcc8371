"""Seconds per GRPO step: AgenticGRPOTrainer (multi-turn, searching) against vanilla TRL GRPOTrainer (single turn).

    python experiments/benchmarks/train_step.py [--steps 5] [--completion 128]

Same tiny random-init Qwen2-architecture model (4 layers, hidden 128, the real Qwen2 vocabulary), same LoRA,
same batch (8 completions: 2 questions x 4 generations), on CPU, same number of completion tokens per
sequence. Vanilla TRL generates ``--completion`` tokens in one turn (min_new_tokens = max). Ours runs the
rollout engine: every trajectory searches twice (a real BM25 index over the fictional world) and answers;
a logits processor decides when the random model writes its tags, and the turn lengths are chosen so that
model tokens plus inserted observation tokens make about the same completion length (both means reported).

Each trainer runs in its own process (so peak memory is its own): step time is the median of TRL's logged
``step_time`` over the steps after the first; peak memory is the process's maximum resident set size.
The last line printed is one JSON object with ``step_time_ratio`` (ours / TRL; target <= 1.15),
``peak_mem_ours_mb`` and ``peak_mem_trl_mb``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
TOKENIZER = ROOT.parent / "shared/data/rtp-llm-qwen-tokenizer/qwen2_tokenizer"


def build(work: Path) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from agentic_rag.data.world import write_world
    from agentic_rag.search.build import build_index

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                 tie_word_embeddings=True)).save_pretrained(work / "model")
    tok.save_pretrained(work / "model")
    paths = write_world(work / "world", seed=0)
    build_index(paths["corpus"], work / "index", progress=False)


def child(kind: str, work: Path, steps: int, completion: int) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from agentic_rag.data.questions import read_questions

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(str(work / "model"))
    model = AutoModelForCausalLM.from_pretrained(str(work / "model"))
    rows = read_questions(work / "world" / "test.jsonl", limit=2 * steps)
    data = Dataset.from_list([{"prompt": r.question, "answers": r.answers} for r in rows])
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")

    def reward(prompts, completions, completion_ids, **kw):
        return [float(sum(ids) % 7) for ids in completion_ids]

    common = dict(output_dir=str(work / f"out-{kind}"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=completion, max_steps=steps, learning_rate=1e-4, report_to=[],
                  use_cpu=True, save_strategy="no", logging_steps=1, seed=0, loss_type="grpo")
    if kind == "trl":
        args = GRPOConfig(**common, generation_kwargs={"min_new_tokens": completion})
        prompts = Dataset.from_list([{"prompt": tok.apply_chat_template(
            [{"role": "user", "content": r.question}], tokenize=False, add_generation_prompt=True)} for r in rows])
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=prompts,
                              processing_class=tok, peft_config=lora)
        lengths = None
    else:
        from rollout import TAGS, WorkloadPolicy

        from agentic_rag.rollout import RolloutLimits
        from agentic_rag.search import open_searcher
        from agentic_rag.tools import SearchTool
        from agentic_rag.training.trainer import AgenticGRPOTrainer

        obs = 32
        free = max(4, (completion - 2 * obs - 30) // 3)
        plans = {r.question: [free, free, free] for r in rows}
        tags = {r.question: [t.format(q=r.gold_titles[0], a="x") for t in TAGS] for r in rows}
        forcing = WorkloadPolicy(model, tok, plans, tags)  # only its processor is used
        args = GRPOConfig(**common)
        limits = RolloutLimits(max_turns=4, max_searches=2, max_tokens_per_turn=completion,
                               max_completion_tokens=completion, passages_per_search=1, max_observation_tokens=obs)
        trainer = AgenticGRPOTrainer(model, tokenizer=tok, reward_funcs=[reward], args=args, train_dataset=data,
                                     tools=SearchTool(open_searcher(work / "index")), limits=limits, chat=False,
                                     processors=[forcing._force], peft_config=lora)
        lengths = []
        original = trainer._rollout

        def rollout(prompts, t):
            out = original(prompts, t)
            lengths.extend(len(c) for c in out["completion_ids"])
            return out

        trainer.rollout_func = rollout
    trainer.train()
    times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h]
    mean_len = statistics.mean(lengths) if lengths else float(completion)
    return {"step_time_s": statistics.median(times[1:]) if len(times) > 1 else times[0], "steps": len(times),
            "mean_completion_tokens": round(mean_len, 1),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--completion", type=int, default=128)
    ap.add_argument("--child", choices=["ours", "trl"])
    ap.add_argument("--work")
    args = ap.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if args.child:
        print(json.dumps(child(args.child, Path(args.work), args.steps, args.completion)))
        return
    work = Path(tempfile.mkdtemp())
    build(work)
    results = {}
    for kind in ("trl", "ours"):
        out = subprocess.run([sys.executable, __file__, "--child", kind, "--work", str(work), "--steps",
                              str(args.steps), "--completion", str(args.completion)], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{kind} failed:\n{out.stderr[-3000:]}")
        results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    ours, trl = results["ours"], results["trl"]
    print(json.dumps({"step_time_ours_s": round(ours["step_time_s"], 3),
                      "step_time_trl_s": round(trl["step_time_s"], 3),
                      "step_time_ratio": round(ours["step_time_s"] / trl["step_time_s"], 3),
                      "completion_tokens_ours": ours["mean_completion_tokens"],
                      "completion_tokens_trl": trl["mean_completion_tokens"],
                      "peak_mem_ours_mb": round(ours["peak_rss_mb"], 1),
                      "peak_mem_trl_mb": round(trl["peak_rss_mb"], 1),
                      "steps": args.steps, "batch": 8}))


if __name__ == "__main__":
    main()
