"""Seconds per GRPO step: AgenticGRPOTrainer (multi-turn, searching) against vanilla TRL GRPOTrainer (single turn).

    python experiments/benchmarks/train_step.py [--steps 5] [--model-tokens 64] [--obs 32]

What is compared, exactly:

* **Model, adapter, batch, optimisation**: the same tiny random-init Qwen2-architecture model (4 layers, hidden
  128, the real Qwen2 vocabulary), the same LoRA (r=8, every linear layer), the same GRPOConfig (8 completions
  per step: 2 questions x 4 generations, lr, seed, loss), on CPU, each trainer in its own process.
* **Prompts**: the same questions and the same prompt token ids on both sides: the agentic dialect's plain-text
  (base-model) prompt, ``build_prompt(tok, question, chat=False)``. Ours builds it; vanilla TRL gets its text and
  tokenizes it itself. Each side records the prompt ids it actually trained on, and the script stops if they
  differ (``prompt_ids_identical`` is reported).
* **Ours**: every trajectory searches twice (a real BM25 index over the fictional world) and answers. A logits
  processor makes the random model write its tags: each turn samples a planned number of free tokens, then the
  turn's tag is forced token by token. The plan makes the model write exactly ``--model-tokens`` tokens per
  trajectory; the environment inserts two observations (at most ``--obs`` tokens each) and the closing
  end-of-sequence token (environment tokens: context in the forward pass, but not projected through the LM head
  and masked out of the loss).
* **LM head scoring, both sides**: TRL's fused LM head projects only the labelled positions (the completion) on
  a GPU, but every position (the prompt too) on a CPU. Our trainer makes the CPU do what the GPU does
  (``agentic_rag.training.model.compact_lm_head_scoring``); the vanilla TRL runs call the same switch, so both
  sides score as they would on a GPU and neither is timed projecting prompts it throws away.
* **Vanilla TRL**, twice: (1) ``min_new_tokens = max_new_tokens = `` our mean model-token count (measured), so
  both decode the same number of model tokens: ``step_time_ratio``; (2) as many tokens as our mean total
  completion length (model + environment tokens), so both score sequences of the same length:
  ``step_time_ratio_equal_length``. Ours does more work per step than (1) (searches, observations, a longer
  loss forward) and less decoding than (2).
* **Token counts are measured**, not assumed, from the batches each trainer scored (``prompt_mask``,
  ``completion_mask`` and the environment mask): mean prompt tokens, model-decoded tokens and environment
  tokens per completion, for every run (``tokens``).

Step time is the median of TRL's logged ``step_time`` over the steps after the first; peak memory is the process's
maximum resident set size. The last line printed is one JSON object with ``step_time_ratio`` (ours / TRL at equal
model-decoded tokens; target <= 1.15), ``step_time_ratio_equal_length``, ``peak_mem_ours_mb`` and
``peak_mem_trl_mb`` (the equal-model-tokens TRL run), and the measured ``tokens`` of each run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
TOKENIZER = ROOT.parent / "shared/data/rtp-llm-qwen-tokenizer/qwen2_tokenizer"
GENERATIONS, QUESTIONS_PER_STEP = 4, 2


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


def turn_plans(tok, rows, model_tokens: int) -> tuple[dict[str, list[int]], dict[str, list[str]]]:
    """Free tokens per turn and tag text per turn, per question, so that the model writes exactly
    ``model_tokens`` tokens: free tokens + the three tags' tokens."""
    from rollout import TAGS

    plans, tags = {}, {}
    for r in rows:
        texts = [t.format(q=r.gold_titles[0], a="x") for t in TAGS]
        fixed = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
        free = model_tokens - fixed
        if free < len(TAGS):
            raise SystemExit(f"--model-tokens {model_tokens} is too small: the tags of {r.question!r} alone take "
                             f"{fixed} tokens; use at least {fixed + len(TAGS)}")
        plans[r.question] = [free // len(TAGS) + (1 if i < free % len(TAGS) else 0) for i in range(len(TAGS))]
        tags[r.question] = texts
    return plans, tags


def measure(trainer, stats: dict) -> None:
    """Record, from every batch the trainer scores, its prompt ids and its token counts per completion."""
    original = trainer._generate_and_score_completions

    def measured(inputs):
        out = original(inputs)
        pm, cm = out["prompt_mask"].bool(), out["completion_mask"]
        model = cm * out["tool_mask"] if "tool_mask" in out else cm
        for i in range(pm.shape[0]):
            ids = out["prompt_ids"][i][pm[i]].tolist()
            stats["prompt_ids"].add(hashlib.sha1(json.dumps(ids).encode()).hexdigest())
        stats["prompt"].extend(pm.sum(1).tolist())
        stats["model"].extend(model.sum(1).tolist())
        stats["env"].extend((cm - model).sum(1).tolist())
        return out

    trainer._generate_and_score_completions = measured


def child(kind: str, work: Path, steps: int, model_tokens: int, obs: int, trl_tokens: int) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.data.questions import read_questions

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(str(work / "model"))
    model = AutoModelForCausalLM.from_pretrained(str(work / "model"))
    rows = read_questions(work / "world" / "test.jsonl", limit=QUESTIONS_PER_STEP * steps)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")

    def reward(prompts, completions, completion_ids, **kw):
        return [float(sum(ids) % 7) for ids in completion_ids]

    stats: dict = {"prompt_ids": set(), "prompt": [], "model": [], "env": []}
    budget = model_tokens + 2 * obs + 8 if kind == "ours" else trl_tokens
    common = dict(output_dir=str(work / f"out-{kind}"), per_device_train_batch_size=GENERATIONS * QUESTIONS_PER_STEP,
                  num_generations=GENERATIONS, max_completion_length=budget, max_steps=steps, learning_rate=1e-4,
                  report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, seed=0, loss_type="grpo")
    if kind == "ours":
        from rollout import WorkloadPolicy

        from agentic_rag.rollout import PromptSettings, RolloutSettings
        from agentic_rag.search import open_searcher
        from agentic_rag.tools import SearchTool
        from agentic_rag.training.trainer import AgenticGRPOTrainer

        plans, tags = turn_plans(tok, rows, model_tokens)
        forcing = WorkloadPolicy(model, tok, plans, tags)  # only its processor is used
        limits = RolloutSettings(max_turns=4, max_searches=2, max_tokens_per_turn=model_tokens,
                               max_completion_tokens=budget, passages_per_search=1, max_observation_tokens=obs)
        data = Dataset.from_list([{"prompt": r.question} for r in rows])
        trainer = AgenticGRPOTrainer(model, tokenizer=tok, reward_funcs=[reward], args=GRPOConfig(**common),
                                     train_dataset=data, tools=SearchTool(open_searcher(work / "index")),
                                     settings=limits, prompt=PromptSettings(chat_template=False),
                                     processors=[forcing._force], peft_config=lora)
    else:
        from agentic_rag.training.model import compact_lm_head_scoring

        compact_lm_head_scoring()  # score like a GPU, as ours does (see the module docstring)
        # the same prompt as ours, as text: TRL tokenizes it (the ids are compared by the parent)
        data = Dataset.from_list([{"prompt": tok.decode(build_prompt(tok, r.question, chat=False))} for r in rows])
        args = GRPOConfig(**common, generation_kwargs={"min_new_tokens": trl_tokens})
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=data,
                              processing_class=tok, peft_config=lora)
    measure(trainer, stats)
    trainer.train()
    times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h]
    return {"step_time_s": statistics.median(times[1:]) if len(times) > 1 else times[0], "steps": len(times),
            "tokens": {k: round(statistics.mean(stats[k]), 1) for k in ("prompt", "model", "env")},
            "model_tokens_min_max": [min(stats["model"]), max(stats["model"])],
            "prompt_ids": sorted(stats["prompt_ids"]),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_child(kind: str, work: Path, args, trl_tokens: int = 0) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--work", str(work), "--steps", str(args.steps),
                          "--model-tokens", str(args.model_tokens), "--obs", str(args.obs),
                          "--trl-tokens", str(trl_tokens)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--model-tokens", type=int, default=64, help="tokens the model writes per trajectory (ours)")
    ap.add_argument("--obs", type=int, default=32, help="most tokens per inserted observation (ours)")
    ap.add_argument("--child", choices=["ours", "trl"])
    ap.add_argument("--work")
    ap.add_argument("--trl-tokens", type=int, default=0, help="(child) tokens vanilla TRL decodes per completion")
    args = ap.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if args.child:
        print(json.dumps(child(args.child, Path(args.work), args.steps, args.model_tokens, args.obs,
                               args.trl_tokens)))
        return
    work = Path(tempfile.mkdtemp())
    try:
        build(work)
        ours = run_child("ours", work, args)
        same_model = round(ours["tokens"]["model"])
        same_length = round(ours["tokens"]["model"] + ours["tokens"]["env"])
        trl = run_child("trl", work, args, trl_tokens=same_model)
        trl_long = run_child("trl", work, args, trl_tokens=same_length)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    identical = ours["prompt_ids"] == trl["prompt_ids"] == trl_long["prompt_ids"]
    if not identical:
        raise SystemExit("the two trainers saw different prompt ids; the comparison would not be like with like")
    print(json.dumps({
        "step_time_ours_s": round(ours["step_time_s"], 3),
        "step_time_trl_s": round(trl["step_time_s"], 3),
        "step_time_trl_equal_length_s": round(trl_long["step_time_s"], 3),
        "step_time_ratio": round(ours["step_time_s"] / trl["step_time_s"], 3),
        "step_time_ratio_equal_length": round(ours["step_time_s"] / trl_long["step_time_s"], 3),
        "tokens": {"ours": ours["tokens"], "trl": trl["tokens"], "trl_equal_length": trl_long["tokens"]},
        "model_tokens_min_max_ours": ours["model_tokens_min_max"],
        "prompt_ids_identical": identical,
        "peak_mem_ours_mb": round(ours["peak_rss_mb"], 1),
        "peak_mem_trl_mb": round(trl["peak_rss_mb"], 1),
        "peak_mem_trl_equal_length_mb": round(trl_long["peak_rss_mb"], 1),
        "steps": args.steps, "batch": GENERATIONS * QUESTIONS_PER_STEP}))


if __name__ == "__main__":
    main()
