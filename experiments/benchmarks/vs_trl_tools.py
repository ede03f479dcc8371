"""Ours against plain TRL 1.16's ``GRPOTrainer(tools=[search])``: the same task, start, settings and machine (issue 58).

    python experiments/benchmarks/vs_trl_tools.py --out /work/runs/vs_trl --steps 3 --seeds 1
    python experiments/benchmarks/vs_trl_tools.py --out /work/runs/vs_trl --steps 6 --seeds 3 --systems ours trl

Three systems, each in a process of its own, run one after the other for each seed (ours, TRL, TRL with continuous
batching, then the next seed), so a slow spell of the shared machine hits all of them:

* ``ours``: ``agentic-rag train`` (``agentic_rag.training.train.run``) on the wiki quick start's config in the native
  format;
* ``trl``: plain ``trl.GRPOTrainer(tools=[search])``, its default generation (``transformers`` ``generate``);
* ``trl_cb``: the same with ``use_transformers_continuous_batching=True``.

What is the same, by construction, not by hand:

* **the start**: one native-format SFT adapter of the wiki task (``--sft``; by default the wiki quick start's SFT of
  the first ``--sft-questions`` training questions' gold trajectories, built once), loaded trainable on the same base
  model by the same function (``training.train.policy_model``);
* **the questions, index and search**: the wiki task's training questions (2WikiMultiHopQA) over its BM25 index. TRL's
  tool is a typed Python function whose text is what our engine shows for a search: the same passages, formatted and
  cut to the same observation budget with the same notice (our engine's own functions);
* **the prompt**: the same chat template (the package's ChatML tool template for SmolLM2), system prompt and tool
  listing; each TRL worker checks that its prompt ids equal ours and reports ``prompt_ids_identical``;
* **the optimisation**: TRL's ``GRPOConfig`` is the one ``agentic-rag train`` builds from the config
  (``training.train.grpo_args``): loss type, clipping, reward scaling, beta, learning rate, schedule, batch,
  micro-batches, gradient accumulation, group size, temperature, seed;
* **the rewards**: exact match + 0.2 x format. TRL's reward functions read its messages and score them with our
  ``exact_match`` and ``check_format``: the model's text is its messages' contents with their tool calls written back
  in the template's ``<tool_call>`` form; a rollout that ends on a call (TRL's iteration limit, or a result dropped for
  length) is scored as ours scores a trajectory that ends on a limit.

What cannot be the same, and what TRL is given instead:

* **Token budgets.** Ours limits each turn (``max_tokens_per_turn``) and the whole trajectory
  (``max_completion_tokens``, tool results included). TRL has only ``max_completion_length``, which also counts tool
  results; it gets ours, so it can show as much as ours. Its turns are not limited: one turn may take the whole
  budget.
* **Turns.** TRL's ``max_tool_calling_iterations`` is ours ``max_searches`` (a model that calls at every turn has
  ``max_turns = max_searches + 1`` turns in both).
* **Stop strings.** Ours ends an answer turn at ``</answer>``; TRL's generation stops at the end-of-turn token only.
* **Dedup.** Ours does not show a passage twice in one trajectory; TRL's function is stateless, so the benchmark turns
  our dedup off (``rollout.dedup_passages=false``) for both to see the same passages.
* **The LM head on a CPU.** TRL 1.16 projects every position of the batch through the vocabulary on a device without
  Triton (for compilers with fixed tile shapes) and keeps only the labelled ones; on a GPU it projects the labelled
  ones. Ours does on a CPU what a GPU does (``training.model.compact_lm_head_scoring``), and by default TRL's workers
  get the same switch (``--trl-lm-head shipped``: TRL as installed), so the training time compares what a GPU user
  would see. TRL still labels its tool results (its loss masks them), so its head projects them; ours does not.

Measured per step, from inside each trainer (the same wrappers on both classes): seconds in generation
(``_generate_and_score_completions``: the rollouts, tools and rewards) and the model tokens it generated (completion
mask x tool mask); seconds in training (the rest of the optimizer step: the loss forward, backward, optimizer) and the
tokens it trained on (prompt + completion positions of the forward pass); the whole step; tool calls per rollout;
tool results cut (ours) or dropped (TRL) for length; the batch reward; peak RSS of the process. After the last step
each adapter is evaluated greedily on the first ``--eval-questions`` validation questions with our evaluation (the
same engine and format for all: the model, not the loop, is measured). The mask check: the ``ours`` worker saves its
last batch's finished trajectories; the TRL worker rebuilds each as TRL would (the model's turns as generated, each
tool turn from TRL's own ``_get_tool_suffix_ids``) and compares ids and masks token by token.

Prints a table, writes the whole run to ``--out``/vs_trl_tools.json (``--record`` copies it to
experiments/benchmarks/results/vs_trl_tools.json) and one JSON line last: ``generation_ratio``, ``training_ratio``,
``step_ratio`` (ours over TRL's default loop: tokens per second for the first two, TRL's seconds over ours for the
step; above 1 is ours faster), ``mask_agreement``, ``em_ours``, ``em_trl``, ``em_sft``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SYSTEMS = ("ours", "trl", "trl_cb")
RESULTS = Path(__file__).resolve().parent / "results" / "vs_trl_tools.json"


# ------------------------------------------------------------------------------------------------ shared settings

def settings_overrides(spec: dict[str, Any], seed: int, run_dir: Path) -> dict[str, Any]:
    """The ``--set`` overrides of the wiki quick start's GRPO config that both systems train with."""
    per_step = spec["questions_per_step"] * spec["generations"]
    micro = spec["micro_batch"]
    if per_step % micro:
        raise SystemExit(f"questions x generations ({per_step}) must be a multiple of the micro-batch ({micro})")
    sets = {"model.name_or_path": spec["base"], "model.tokenizer": spec["base"], "model.adapter": spec["sft"],
            "data.train_file": spec["train_file"], "search.index": spec["index"], "rollout.dialect": "native",
            "rollout.dedup_passages": "false", "prompt.system_prompt": spec["system_prompt"],
            "checkpoint.output_dir": str(run_dir), "checkpoint.save_steps": 100000, "seed": seed,
            "algorithm.max_steps": spec["steps"], "algorithm.num_generations": spec["generations"],
            "algorithm.per_device_train_batch_size": micro,
            "algorithm.gradient_accumulation_steps": per_step // micro,
            "logging.swanlab_mode": "disabled", "logging.validation_file": ""}
    sets.update({f"rollout.{k}": v for k, v in spec["room"].items()})
    sets.update(kv.split("=", 1) for kv in spec.get("sets", []))  # --set: after the benchmark's own
    return sets


def load_cfg(spec: dict[str, Any], seed: int, run_dir: Path):
    from agentic_rag.training.config import load_config

    sets = settings_overrides(spec, seed, run_dir)
    return load_config(spec["config"], overrides=[f"{k}={v}" for k, v in sets.items()])


# ------------------------------------------------------------------------------------------------ instrumentation

class Meter:
    """Per-step timings and token counts, from wrappers put on a trainer class's methods (the same on both)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.current = self._fresh()
        self.step_started = 0.0

    @staticmethod
    def _fresh() -> dict[str, Any]:
        return {"generation_s": 0.0, "generated_tokens": 0, "trained_tokens": 0, "rollouts": 0, "tool_calls": 0,
                "results_cut": 0, "results_dropped": 0, "rollouts_ending_on_a_call": 0, "completion_tokens": 0}

    def install(self, cls: type) -> None:
        from transformers import TrainerCallback

        meter = self
        generate = cls._generate_and_score_completions
        compute_loss = cls.compute_loss
        train = cls.train

        def timed_generate(self, inputs):
            started = time.perf_counter()
            out = generate(self, inputs)
            meter.current["generation_s"] += time.perf_counter() - started
            mask = out["completion_mask"]
            if out.get("tool_mask") is not None:
                mask = mask * out["tool_mask"]
            meter.current["generated_tokens"] += int(mask.sum())
            meter.current["completion_tokens"] += int(out["completion_mask"].sum())
            meter.current["rollouts"] += int(out["completion_mask"].size(0))
            return out

        def counted_loss(self, model, inputs, *args, **kwargs):
            meter.current["trained_tokens"] += int(inputs["prompt_mask"].sum()) + int(inputs["completion_mask"].sum())
            return compute_loss(self, model, inputs, *args, **kwargs)

        class StepClock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                meter.step_started = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                step = dict(meter.current, step=state.global_step,
                            step_s=time.perf_counter() - meter.step_started)
                step["training_s"] = step["step_s"] - step["generation_s"]
                meter.steps.append(step)
                meter.current = meter._fresh()

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "reward" in logs and meter.steps:
                    meter.steps[-1]["reward"] = float(logs["reward"])

        def train_with_clock(self, *args, **kwargs):
            self.add_callback(StepClock())
            return train(self, *args, **kwargs)

        cls._generate_and_score_completions = timed_generate
        cls.compute_loss = counted_loss
        cls.train = train_with_clock


def machine(threads: int) -> dict[str, Any]:
    """The machine a record was measured on: timings of two records compare only on the same CPU (a CPU with
    AVX512-BF16 or AMX also builds the SFT start under bf16 autocast, ``sft_cpu_autocast: auto``)."""
    from agentic_rag.training.machine import cpu_has_native_bf16

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 platform.processor())
    return {"cores": len(os.sched_getaffinity(0)), "threads": threads, "cpu": model,
            "native_bf16": cpu_has_native_bf16(cpuinfo)}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------------------------------------ ours

def worker_ours(spec: dict[str, Any], seed: int, run_dir: Path) -> dict[str, Any]:
    from agentic_rag.rollout.events import calls_by_tool
    from agentic_rag.training import train as train_module
    from agentic_rag.training.trainer import AgenticGRPOTrainer

    meter = Meter()
    meter.install(AgenticGRPOTrainer)
    last: dict[str, Any] = {}
    log_rollouts = AgenticGRPOTrainer._log_rollouts

    def keep(self, trajs):
        last["trajs"] = list(trajs)
        last["tokenizer"] = self.processing_class
        calls = sum(sum(calls_by_tool(t.events).values()) for t in trajs)
        meter.current["tool_calls"] += calls
        meter.current["results_cut"] += sum(1 for t in trajs for e in t.events
                                            if e.get("type") == "observation" and e.get("truncated"))
        meter.current["rollouts_ending_on_a_call"] += sum(1 for t in trajs if t.finish_reason in (
            "max_turns", "max_searches", "max_completion_tokens"))
        return log_rollouts(self, trajs)

    AgenticGRPOTrainer._log_rollouts = keep
    cfg = load_cfg(spec, seed, run_dir)
    train_module.run(cfg)
    tok = last["tokenizer"]
    sample = [t for t in last["trajs"] if t.is_linear][:spec["mask_sample"]]
    saved = [{"prompt_ids": t.prompt_ids, "completion_ids": t.completion_ids, "env_mask": t.env_mask,
              "segments": [{"source": seg.source, "ids": t.completion_ids[seg.start:seg.end]} for seg in t.segments],
              "text": tok.decode(t.completion_ids)} for t in sample]
    (run_dir / "mask_sample.json").write_text(json.dumps(saved))
    return {"steps": meter.steps, "peak_rss_mb": peak_rss_mb(), "adapter": str(run_dir / "final")}


# ------------------------------------------------------------------------------------------------ TRL

def search_function(spec: dict[str, Any], cfg, tokenizer, meter: Meter | None = None):
    """TRL's tool: a typed function whose result is the text our engine shows for one search (the same passages,
    format, observation budget and cut; a cut result is counted in ``meter``)."""
    from agentic_rag.rollout import AgentRollout
    from agentic_rag.search import open_searcher

    searcher = open_searcher(cfg.search.index, cfg.search.retriever)
    engine = AgentRollout(None, tokenizer, searcher, cfg.rollout)
    dialect = engine.dialect
    k = cfg.rollout.passages_per_search

    def search(query: str):  # no return annotation: TRL would list it in the schema, ours lists none
        """Search the document collection; returns the best matching passages.

        Args:
            query: what to search for
        """
        hits = [dialect.neutral_hit(h) for h in searcher.batch_search([query], k)[0][:k]]
        body = dialect.format_passages(hits) if hits else "No new results."
        body = dialect.neutralize(body)
        text, kept = engine._cut_text(body, cfg.rollout.max_observation_tokens)
        if meter is not None and kept < len(body):
            meter.current["results_cut"] += 1
        return text

    return search, engine, searcher


def model_text(messages: list[dict[str, Any]]) -> str:
    """What the model wrote in TRL's parsed messages: each assistant turn's content and its tool calls, written back in
    the template's ``<tool_call>`` form."""
    parts = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        text = m.get("content") or ""
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call)
            text += '<tool_call>\n' + json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}) + \
                '\n</tool_call>'
        parts.append(text)
    return "".join(parts)


def trl_rewards(dialect, eos: list[str]):
    from agentic_rag.rewards.accuracy import exact_match
    from agentic_rag.rewards.format import check_format

    def finish(messages: list[dict[str, Any]]) -> str:
        last = messages[-1] if messages else {}
        return "max_turns" if last.get("role") == "tool" or last.get("tool_calls") else "answer"

    def em(completions, golds, **kw):
        out = []
        for messages, gold in zip(completions, golds, strict=True):
            last = next((m for m in reversed(messages) if m.get("role") == "assistant"), {})
            answer = dialect.extract_answer(last.get("content") or "")
            out.append(exact_match(answer, gold) if answer is not None and finish(messages) == "answer" else 0.0)
        return out

    def format(completions, **kw):  # noqa: A001 - the reward's name in TRL's logs
        return [check_format(model_text(m), [], finish(m), dialect, eos_tokens=eos).score() for m in completions]

    return [em, format]


def trl_mask_check(trainer, sample: list[dict[str, Any]], tokenizer) -> dict[str, Any]:
    """Each of our saved trajectories rebuilt as TRL builds one: the model's turns as generated (mask 1), each tool
    turn from TRL's ``_get_tool_suffix_ids`` on the tool messages our results hold (mask 0). Compared token by token."""
    agree = total = 0
    same_ids = 0
    differences: list[dict[str, Any]] = []
    closing: list[str] = []
    for row in sample:
        ids: list[int] = []
        mask: list[int] = []
        for seg in row["segments"]:
            if seg["source"] == "model":
                ids += seg["ids"]
                mask += [1] * len(seg["ids"])
            else:
                text = tokenizer.decode(seg["ids"])
                results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, flags=re.S)
                if not results:  # ours closes an answer with an end-of-turn token (in TRL the model writes it)
                    closing.append(text)
                    ids += seg["ids"]
                    mask += [0] * len(seg["ids"])
                    continue
                suffix = trainer._get_tool_suffix_ids([{"role": "tool", "name": "search", "content": r}
                                                       for r in results])
                ids += suffix
                mask += [0] * len(suffix)
        ours_ids, ours_mask = row["completion_ids"], row["env_mask"]
        if ids == ours_ids:
            same_ids += 1
            agree += sum(a == b for a, b in zip(mask, ours_mask, strict=True))
            total += len(mask)
        else:
            n = min(len(ids), len(ours_ids))
            first = next((i for i in range(n) if ids[i] != ours_ids[i]), n)
            differences.append({"first_difference_at": first, "ours": tokenizer.decode(ours_ids[first:first + 12]),
                                "trl": tokenizer.decode(ids[first:first + 12])})
            # the tokens before the first difference are the same sequence: compare their masks there
            agree += sum(a == b for a, b in zip(mask[:first], ours_mask[:first], strict=True))
            total += first
    return {"trajectories": len(sample), "identical_ids": same_ids, "tokens_compared": total,
            "mask_agreement": agree / total if total else None, "differences": differences[:5],
            "environment_segments_without_a_tool_turn": sorted(set(closing))}


def worker_trl(spec: dict[str, Any], seed: int, run_dir: Path, continuous: bool) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import set_seed
    from trl import GRPOTrainer
    from trl.chat_template_utils import is_chat_template_prefix_preserving, qwen3_template

    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.models import load_tokenizer
    from agentic_rag.rollout.native import prepare_tokenizer
    from agentic_rag.training.train import grpo_args, policy_model, training_rows

    meter = Meter()
    meter.install(GRPOTrainer)
    if spec["trl_lm_head"] == "compact":
        from agentic_rag.training.model import compact_lm_head_scoring

        compact_lm_head_scoring()  # score like a GPU, as ours does (see the module docstring)
    cfg = load_cfg(spec, seed, run_dir)
    set_seed(cfg.seed)
    tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.name_or_path)
    prepare_tokenizer(tokenizer)  # the template ours trains with (SmolLM2's own knows no tools)
    # our template writes calls as Qwen's does (<tool_call> JSON, <|im_end|>): TRL parses them with Qwen's parser
    tokenizer.response_template = qwen3_template
    search, engine, searcher = search_function(spec, cfg, tokenizer, meter)
    rows = training_rows(cfg)
    system = cfg.prompt.system_prompt
    dataset = Dataset.from_list([{"prompt": [{"role": "system", "content": system},
                                             {"role": "user", "content": r["prompt"]}],
                                  "golds": list(r["answers"])} for r in rows])
    args = grpo_args(cfg, use_cpu=True)
    args.report_to = []
    args.save_strategy = "no"
    args.max_tool_calling_iterations = cfg.rollout.max_searches
    args.use_transformers_continuous_batching = continuous
    args.logging_steps = 1
    args.reward_weights = [1.0, 0.2]  # em + 0.2 x format, as the config's rewards
    model, peft_config = policy_model(cfg)
    eos = [tokenizer.eos_token] if tokenizer.eos_token else []
    trainer = GRPOTrainer(model=model, reward_funcs=trl_rewards(engine.dialect, eos), args=args,
                          train_dataset=dataset, processing_class=tokenizer, tools=[search], peft_config=peft_config)
    # the prompt TRL renders for the first question, against ours
    trl_prompt = tokenizer.apply_chat_template(dataset[0]["prompt"], tools=[search], add_generation_prompt=True,
                                               tokenize=True, return_dict=False)
    ours_prompt = build_prompt(tokenizer, rows[0]["prompt"], "native", chat=True, system=system,
                               tools=ours_schemas(cfg, searcher))
    generate = GRPOTrainer._tool_call_loop

    def counted_loop(self, prompts, prompt_ids, completion_ids, completions, *a, **kw):
        out = generate(self, prompts, prompt_ids, completion_ids, completions, *a, **kw)
        _, done, _, _, calls, _, _ = out
        meter.current["tool_calls"] += calls
        for messages in done:
            if not messages or not messages[-1].get("tool_calls"):
                continue
            meter.current["rollouts_ending_on_a_call"] += 1
            rounds = sum(1 for m in messages if m.get("tool_calls"))
            if rounds <= self.max_tool_calling_iterations:  # iterations left: its results were rolled back for length
                meter.current["results_dropped"] += 1
        return out

    GRPOTrainer._tool_call_loop = counted_loop
    stats = {"prompt_ids_identical": list(trl_prompt) == list(ours_prompt), "prompt_tokens": len(trl_prompt),
             "prefix_preserving_template": is_chat_template_prefix_preserving(tokenizer)}
    sample_path = Path(spec["mask_sample_from"]) if spec.get("mask_sample_from") else None
    if sample_path and sample_path.exists():
        stats["mask_check"] = trl_mask_check(trainer, json.loads(sample_path.read_text()), tokenizer)
    trainer.train()
    trainer.save_model(str(run_dir / "final"))
    tokenizer.save_pretrained(str(run_dir / "final"))
    return {"steps": meter.steps, "peak_rss_mb": peak_rss_mb(), "adapter": str(run_dir / "final"), **stats}


def ours_schemas(cfg, searcher) -> list[dict[str, Any]]:
    """The schemas ours lists in its prompt: the config's tools, built as ``agentic-rag train`` builds them (on the
    searcher TRL's tool already opened)."""
    from agentic_rag.tools.build import build_tools

    tools = build_tools(cfg.tools, searcher=searcher)
    try:
        return tools.schemas()
    finally:
        tools.close()


# ------------------------------------------------------------------------------------------------ driver

def prepare(args) -> dict[str, Any]:
    """The wiki task, its native-format SFT start and the settings every worker reads."""
    from agentic_rag.demo.quickstart import models_of, native_room
    from agentic_rag.demo.wiki import WikiSettings, build_model, build_task, sft, trajectories
    from agentic_rag.training.config import load_config

    task = Path(args.task_dir or Path(args.out) / "task").resolve()
    s = WikiSettings(out=task, seeds=[0], dialect="native", questions=args.questions, fast=True,  # 128-token recipe
                     **({"model": args.model} if args.model else {}))
    build_task(s)
    init = build_model(s)
    if args.sft:
        sft_dir = Path(args.sft).resolve()
    else:
        first = task / f"train_first{args.sft_questions}.jsonl"
        if not first.exists():
            first.write_text("".join(s.train_file.read_text().splitlines(keepends=True)[:args.sft_questions]))
        data = task / "sft_data_native.jsonl"
        trajectories(s, init, questions=first, out=data)
        s.sft_learning_rate = args.sft_lr
        sft_dir = sft(s, init, data=data, out=task / f"sft_native_lr{args.sft_lr:g}")
    base, _ = models_of(s, sft_dir)
    config = s.train_config
    rollout = load_config(config, env={}, check_files=False).rollout
    return {"config": str(config), "base": base, "sft": str(sft_dir), "train_file": str(s.train_file),
            "validation_file": str(s.validation_file), "index": str(s.index_dir), "task": str(task),
            "system_prompt": "Answer the question by searching.", "room": native_room(rollout),
            "steps": args.steps, "generations": args.generations, "questions_per_step": args.questions_per_step,
            "micro_batch": args.micro_batch, "mask_sample": 16, "threads": args.threads,
            "trl_lm_head": args.trl_lm_head, "sets": args.sets}


def run_worker(system: str, spec: dict[str, Any], seed: int, run_dir: Path, log_path: Path) -> dict[str, Any]:
    result_path = run_dir.with_name(run_dir.name + ".result.json")
    if result_path.exists():
        return json.loads(result_path.read_text())
    if run_dir.exists():  # an unfinished run: started again
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir.with_name(run_dir.name + ".spec.json")
    spec_path.write_text(json.dumps(spec, indent=1))
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), MKL_NUM_THREADS=str(spec["threads"]),
               TOKENIZERS_PARALLELISM="false", AGENTIC_RAG_JVM_HEAP="1g")
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run([sys.executable, __file__, "--worker", system, "--spec", str(spec_path),
                               "--seed", str(seed), "--run-dir", str(run_dir)], stdout=log, stderr=subprocess.STDOUT,
                              env=env)
    if proc.returncode != 0:
        tail = log_path.read_text()[-3000:]
        return {"failed": True, "returncode": proc.returncode, "log_tail": tail}
    result = json.loads(result_path.read_text())
    result["wall_s"] = time.perf_counter() - started
    result_path.write_text(json.dumps(result))
    return result


def evaluate_adapter(spec: dict[str, Any], name: str, adapter: str, questions: int) -> dict[str, Any]:
    from agentic_rag.demo.wiki import WikiSettings, evaluate

    s = WikiSettings(out=Path(spec["task"]), seeds=[0], dialect="native", fast=True)
    subset = Path(spec["task"]) / f"validation_first{questions}.jsonl"
    if not subset.exists():
        subset.write_text("".join(Path(spec["validation_file"]).read_text().splitlines(keepends=True)[:questions]))
    # under the task folder (its index and splits), named by this benchmark's folder and question count: a cached
    # evaluation is reused only for the same adapter path and questions
    where = f"vs_trl-{hashlib.sha1(spec['out'].encode()).hexdigest()[:8]}-q{questions}/{name}"
    summary = evaluate(s, where, spec["base"], adapter, questions=subset)
    return {"em": summary["metrics"]["em"], "searches_per_question": summary.get("searches_per_question")}


def summarize(result: dict[str, Any], skip_first: bool) -> dict[str, Any]:
    """Totals over the measured steps (the first one is skipped with more than one step: it pays for warm-up)."""
    steps = result["steps"][1:] if skip_first and len(result["steps"]) > 1 else result["steps"]
    total = {k: sum(s[k] for s in steps) for k in (
        "generation_s", "training_s", "step_s", "generated_tokens", "trained_tokens", "rollouts", "tool_calls",
        "results_cut", "results_dropped", "rollouts_ending_on_a_call", "completion_tokens")}
    return {"steps_measured": len(steps),
            "generation_s_per_1k_generated_tokens": 1000 * total["generation_s"] / max(1, total["generated_tokens"]),
            "training_s_per_1k_trained_tokens": 1000 * total["training_s"] / max(1, total["trained_tokens"]),
            "step_s": total["step_s"] / max(1, len(steps)),
            "generated_tokens_per_step": total["generated_tokens"] / max(1, len(steps)),
            "trained_tokens_per_step": total["trained_tokens"] / max(1, len(steps)),
            "tool_calls_per_rollout": total["tool_calls"] / max(1, total["rollouts"]),
            "results_cut_per_rollout": total["results_cut"] / max(1, total["rollouts"]),
            "results_dropped_per_rollout": total["results_dropped"] / max(1, total["rollouts"]),
            "rollouts_ending_on_a_call": total["rollouts_ending_on_a_call"] / max(1, total["rollouts"]),
            "peak_rss_mb": result["peak_rss_mb"],
            "rewards": [s.get("reward") for s in result["steps"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the run's folder (the task, the SFT start, each run)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--cb-seeds", type=int, default=1,
                    help="seeds that run TRL with continuous batching (its speed, not its learning, is the question)")
    ap.add_argument("--questions-per-step", type=int, default=8)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--eval-questions", type=int, default=200, help="first N validation questions (greedy EM)")
    ap.add_argument("--task-dir", help="an existing wiki task folder (default OUT/task)")
    ap.add_argument("--sft", help="a native-format SFT adapter of that task (default: built in the task folder)")
    ap.add_argument("--sft-questions", type=int, default=256)
    ap.add_argument("--sft-lr", type=float, default=1e-3,
                    help="the built SFT's learning rate (1e-3: the native format's best in experiments/quickstart)")
    ap.add_argument("--questions", type=int, default=None, help="keep the first N questions of each split (smoke)")
    ap.add_argument("--model", default=None,
                    help="the base model of the SFT start and of every system (default: the wiki quick start's, the "
                         "packaged SmolLM2-135M-Instruct; a model directory whose chat template knows tools, e.g. a "
                         "tiny random Qwen2, for a smoke run)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--trl-lm-head", choices=("compact", "shipped"), default="compact",
                    help="compact: TRL's LM head projects only the labelled positions on the CPU too, as on a GPU and "
                         "as ours does (the default); shipped: TRL 1.16 as installed (every position on a CPU)")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                    help="a training config override for every system, applied after the benchmark's own (e.g. "
                         "rollout.max_completion_tokens=64: a random model of a smoke run writes to the budget)")
    ap.add_argument("--record", action="store_true", help=f"also write the run to {RESULTS}")
    ap.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        run_dir = Path(args.run_dir)
        if args.worker == "ours":
            result = worker_ours(spec, args.seed, run_dir)
        else:
            result = worker_trl(spec, args.seed, run_dir, continuous=args.worker == "trl_cb")
        run_dir.with_name(run_dir.name + ".result.json").write_text(json.dumps(result, default=str))
        return
    if not args.out:
        ap.error("--out is required")
    if bad := [kv for kv in args.sets if "=" not in kv]:
        ap.error(f"--set takes KEY=VALUE, got {bad}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = dict(prepare(args), out=str(out))
    em_sft = evaluate_adapter(spec, "sft", spec["sft"], args.eval_questions)["em"]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in args.systems}
    # seed by seed, ours and TRL alternately; continuous batching (slow on a CPU, and its speed, not its learning, is
    # the question) after them, so a long run of it never holds back the seeds
    order = [(seed, system) for seed in range(args.seeds) for system in args.systems if system != "trl_cb"]
    order += [(seed, "trl_cb") for seed in range(min(args.seeds, args.cb_seeds)) if "trl_cb" in args.systems]
    for seed, system in order:
        run_dir = out / "runs" / f"{system}-seed{seed}"
        sample = out / "runs" / f"ours-seed{seed}" / "mask_sample.json"
        wspec = dict(spec, mask_sample_from=str(sample) if system != "ours" else None)
        print(f"== {system} seed {seed}", flush=True)
        result = run_worker(system, wspec, seed, run_dir, out / "runs" / f"{system}-seed{seed}.log")
        if result.get("failed"):
            print(f"   {system} failed (exit {result['returncode']}):\n{result['log_tail']}", flush=True)
            runs[system].append({"seed": seed, "failed": True, "log_tail": result["log_tail"][-1500:]})
            continue
        row = {"seed": seed, **summarize(result, skip_first=args.steps > 1),
               **{k: result[k] for k in ("prompt_ids_identical", "prompt_tokens", "mask_check",
                                         "prefix_preserving_template") if k in result},
               "eval": evaluate_adapter(spec, f"{system}-seed{seed}", result["adapter"], args.eval_questions),
               "steps": result["steps"]}
        runs[system].append(row)
        print(f"   {system} seed {seed}: step {row['step_s']:.1f} s, generation "
              f"{row['generation_s_per_1k_generated_tokens']:.1f} s/1k tokens, training "
              f"{row['training_s_per_1k_trained_tokens']:.2f} s/1k tokens, EM {row['eval']['em']:.3f}",
              flush=True)

    def mean(system: str, key: str) -> float | None:
        values = [r[key] if key != "em" else r["eval"]["em"] for r in runs.get(system, []) if not r.get("failed")]
        return statistics.fmean(values) if values else None

    def ratio(key: str, invert: bool) -> float | None:
        a, b = mean("ours", key), mean("trl", key)
        if a is None or b is None or not a or not b:
            return None
        return b / a if invert else a / b

    keys = ("generation_s_per_1k_generated_tokens", "training_s_per_1k_trained_tokens", "step_s",
            "generated_tokens_per_step", "trained_tokens_per_step", "tool_calls_per_rollout", "results_cut_per_rollout",
            "results_dropped_per_rollout",
            "rollouts_ending_on_a_call", "peak_rss_mb", "em")
    print("| | " + " | ".join(args.systems) + " |")
    print("|---|" + "---|" * len(args.systems))
    for key in keys:
        cells = [mean(s, key) for s in args.systems]
        print(f"| {key} | " + " | ".join("failed" if c is None else f"{c:.3f}" for c in cells) + " |")
    masks = [r["mask_check"] for s in args.systems if s != "ours" for r in runs[s]
             if not r.get("failed") and r.get("mask_check")]
    compared = sum(m["tokens_compared"] for m in masks)
    agreement = sum(m["mask_agreement"] * m["tokens_compared"] for m in masks if m["mask_agreement"] is not None) / \
        compared if compared else None
    record = {"command": " ".join(sys.argv), "machine": machine(args.threads),
              "spec": spec, "em_sft": em_sft, "runs": runs}
    (out / "vs_trl_tools.json").write_text(json.dumps(record, indent=1, default=str))
    if args.record:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(record, indent=1, default=str))
    print(json.dumps({"generation_ratio": ratio("generation_s_per_1k_generated_tokens", True),
                      "training_ratio": ratio("training_s_per_1k_trained_tokens", True),
                      "step_ratio": ratio("step_s", True), "mask_agreement": agreement,
                      "em_ours": mean("ours", "em"), "em_trl": mean("trl", "em"), "em_trl_cb": mean("trl_cb", "em"),
                      "em_sft": em_sft, "steps": args.steps, "seeds": args.seeds,
                      "continuous_batching_ok": bool(runs.get("trl_cb")) and not any(
                          r.get("failed") for r in runs.get("trl_cb", []))}))


if __name__ == "__main__":
    main()
