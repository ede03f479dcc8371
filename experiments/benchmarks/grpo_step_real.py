"""Where a real-model GRPO step spends its time and memory: SmolLM2-135M-Instruct, the quick start's training
config, from the quick start's SFT adapter.

    python experiments/benchmarks/grpo_step_real.py --quickstart outputs/quickstart [--steps 2]
        [--threads 2] [--set algorithm.per_device_train_batch_size=16 --set ...]
    python experiments/benchmarks/grpo_step_real.py --task wiki --quickstart outputs/quickstart_wiki --compare none

``--task wiki`` measures the wiki task's step instead (``src/agentic_rag/resources/configs/wiki_grpo_smollm2.yaml`` from
``QUICKSTART/sft`` on ``QUICKSTART/data/train.jsonl`` and ``QUICKSTART/index``; ``--set model.adapter=DIR`` starts
from another adapter, a recipe's own SFT start, and then the quick start needs none); ``--compare none`` measures the
trainer as shipped alone. Every result splits the step into generation (the rollout less the time it only waited
for searches), search (the searches' own time, from the trainer's ``timing/search_s``; most of it overlaps decoding),
the scoring forward passes and the rest of the training step (backward, optimizer).

Each variant runs in its own process (``OMP_NUM_THREADS`` = ``--threads``, default 2; the JVM heap at 1 GB as
the quick start sets it) and trains ``--steps`` optimizer steps of the packaged ``world_grpo_smollm2.yaml``
(with the ``--set`` overrides) from ``QUICKSTART/sft`` on ``QUICKSTART/world`` and ``QUICKSTART/index``:

* ``by_length``: the trainer as shipped: each optimizer step's rows dealt into micro-batches by length, each
  micro-batch scored over its own width (``group_by_length``, ``used_columns``).
* ``trl_order``: the same with both turned off (TRL's shuffled micro-batches, every one as wide as the batch).

Measured per variant, seconds an optimizer step: in the rollout (generation, search), in the scoring forward passes
(``_get_per_token_logps_and_entropies``), in the whole training step (``training_step_s``: TRL rolls out inside
it) and in the rest of it (backward, optimizer: the training step less the rollout and the scoring); the median of TRL's
logged ``step_time``; the width of every scored micro-batch as TRL hands it over and as the model sees it, its
real tokens, and the padding fraction of what the model saw; and the peak resident set size of the
process in each phase of the first optimizer step (a sampler thread, every 20 ms): model load, trainer set-up
(JVM, TRL), rollout, training step (forward + backward), optimizer and logging; then of the later steps together
(RSS seldom falls: the allocator keeps what it got, so a later phase would show an earlier one's peak). The last
line printed is one JSON object with both variants and ``scoring_forward_ratio`` (by_length / trl_order).

``--compare micro_batch`` measures instead the shipped micro-batch of 4 trajectories against 8 with half the
accumulation steps (the same rollouts and the same gradient per step): ``peak_rss_ratio`` and
``step_time_ratio`` (4 / 8).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGED = ROOT / "src" / "agentic_rag" / "resources" / "configs"  # the shipped configs live only there
CONFIGS = {"world": PACKAGED / "world_grpo_smollm2.yaml", "wiki": PACKAGED / "wiki_grpo_smollm2.yaml"}
TRAIN_FILES = {"world": "world/train.jsonl", "wiki": "data/train.jsonl"}  # inside the quick start's directory
CONFIG = CONFIGS["world"]


def measure(quickstart: Path, steps: int, variant: str, sets: list[str], task: str = "world") -> dict:
    import psutil

    proc = psutil.Process()
    phase = ["imports"]
    peaks: dict[str, float] = {}

    rollouts = [0]  # phases are attributed within the first optimizer step only: RSS seldom falls (the
    # allocator keeps what it got), so a later step's rollout would show the previous step's training peak

    def sample() -> None:
        while True:
            rss = proc.memory_info().rss / 2**30
            label = phase[0] if rollouts[0] <= 1 else "later steps"
            peaks[label] = max(peaks.get(label, 0.0), rss)
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    import agentic_rag.training.trainer as T
    from agentic_rag.training import train

    if variant == "trl_order":
        T.group_by_length = lambda batches, per_step: batches
        T.used_columns = lambda mask, prompt_width: (0, mask.size(1))
    times = {"rollout_s": 0.0, "scoring_forward_s": 0.0, "training_step_s": 0.0}
    widths: list[dict] = []

    def timed(name: str, label: str, after: str, key: str | None = None):
        orig = getattr(T.AgenticGRPOTrainer, name)

        def wrapper(self, *a, **k):
            if name == "_rollout":
                rollouts[0] += 1
            before, phase[0] = phase[0], label
            t = time.perf_counter()
            try:
                return orig(self, *a, **k)
            finally:
                if key:
                    times[key] += time.perf_counter() - t
                phase[0] = after or before
        setattr(T.AgenticGRPOTrainer, name, wrapper)

    timed("__init__", "trainer set-up (JVM, TRL)", "before the first step")
    # TRL rolls out inside the first micro-batch's training_step: afterwards that training step goes on
    timed("_rollout", "rollout", "", "rollout_s")
    timed("training_step", "training step (forward + backward)", "optimizer and logging", "training_step_s")
    score = T.AgenticGRPOTrainer._get_per_token_logps_and_entropies

    def scored(self, model, input_ids, attention_mask, logits_to_keep, *a, **k):
        t = time.perf_counter()
        out = score(self, model, input_ids, attention_mask, logits_to_keep, *a, **k)
        times["scoring_forward_s"] += time.perf_counter() - t
        first, last = T.used_columns(attention_mask, input_ids.size(1) - logits_to_keep)  # what the model saw
        widths.append({"rows": int(input_ids.size(0)), "batch_width": int(input_ids.size(1)),
                       "model_width": last - first, "real_tokens": int(attention_mask.sum())})
        return out
    T.AgenticGRPOTrainer._get_per_token_logps_and_entropies = scored
    load = train.policy_model

    def loading(cfg):
        phase[0] = "model load"
        try:
            return load(cfg)
        finally:
            phase[0] = "after model load"
    train.policy_model = loading
    out_dir = Path(tempfile.mkdtemp(prefix="grpo_step_real_"))
    base = [f"model.adapter={quickstart / 'sft'}", f"data.train_file={quickstart / TRAIN_FILES[task]}",
            f"search.index={quickstart / 'index'}", f"checkpoint.output_dir={out_dir}", "checkpoint.save_steps=1000",
            "logging.swanlab_mode=disabled", f"algorithm.max_steps={steps}",
            "logging.validation_file="]  # the steps alone: the wiki config validates every few steps
    args = ["--config", str(CONFIGS[task]), "--log-level", "WARNING"]
    for kv in base + sets:
        args += ["--set", kv]
    phase[0] = "config"
    started = time.perf_counter()
    code = train.main(args)
    if code:
        raise SystemExit(f"the measured training run failed (exit {code}); its message is above")
    total = time.perf_counter() - started
    history = json.loads((out_dir / "train_summary.json").read_text())["log_history"]
    step_times = sorted(h["step_time"] for h in history if "step_time" in h)

    def logged(key: str) -> float:
        return sum(h[key] for h in history if key in h) / steps

    split = {"generation_s": round(times["rollout_s"] / steps - logged("timing/search_wait_s"), 1),
             "search_s": round(logged("timing/search_s"), 2), "search_wait_s": round(logged("timing/search_wait_s"), 2)}
    return {"variant": variant, "task": task, "steps": steps, "total_s": round(total, 1), **split,
            "step_time_median_s": round(step_times[len(step_times) // 2], 1) if step_times else None,
            **{k: round(v / steps, 1) for k, v in times.items()},
            # TRL rolls out inside the training step (its _prepare_inputs): the rest is the step less both
            "backward_and_rest_of_training_step_s": round((times["training_step_s"] - times["scoring_forward_s"]
                                                           - times["rollout_s"]) / steps, 1),
            "micro_batches": widths,
            "padding_fraction": round(1 - sum(w["real_tokens"] for w in widths)
                                      / max(1, sum(w["rows"] * w["model_width"] for w in widths)), 3),
            "peak_rss_gb_by_phase": {k: round(v, 2) for k, v in peaks.items()},
            "peak_rss_gb": round(max(peaks.values()), 2)}


def micro_batch_8() -> list[str]:
    """Overrides for a micro-batch of 8 with the shipped config's rollouts per optimizer step."""
    import yaml

    algo = yaml.safe_load(CONFIG.read_text())["algorithm"]
    rollouts = algo["per_device_train_batch_size"] * algo["gradient_accumulation_steps"]
    if rollouts % 8:
        raise SystemExit(f"{CONFIG.name}: {rollouts} rollouts per step do not split into micro-batches of 8")
    return ["algorithm.per_device_train_batch_size=8", f"algorithm.gradient_accumulation_steps={rollouts // 8}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quickstart", default="outputs/quickstart", help="a quick start's output directory")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="OMP threads of each measured process (default 2)")
    ap.add_argument("--set", action="append", default=[], dest="sets", help="a training config override")
    ap.add_argument("--task", choices=sorted(CONFIGS), default="world", help="whose training step: the world "
                    "quick start's (default) or the wiki task's")
    ap.add_argument("--compare", choices=["order", "micro_batch", "none"], default="order",
                    help="order (default): by_length vs trl_order; micro_batch: the shipped micro-batch of 4 vs 8 "
                         "with half the accumulation steps, the same rollouts and gradient per step; none: the "
                         "trainer as shipped alone")
    ap.add_argument("--variant", choices=["by_length", "trl_order"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    qs = Path(args.quickstart).resolve()
    adapter = next((kv.split("=", 1)[1] for kv in reversed(args.sets) if kv.startswith("model.adapter=")), None)
    if adapter is not None:  # another adapter (a recipe's own SFT start): the quick start's is not needed
        if not (Path(adapter) / "adapter_config.json").exists():
            ap.error(f"--set model.adapter={adapter}: no adapter_config.json there")
    elif not (qs / "sft" / "adapter_config.json").exists():
        ap.error(f"no SFT adapter at {qs / 'sft'}: run the quick start first (bash script/quickstart.sh)")
    if args.variant:
        print("RESULT " + json.dumps(measure(qs, args.steps, args.variant, args.sets, args.task)), flush=True)
        return 0
    global CONFIG
    CONFIG = CONFIGS[args.task]
    runs = {"by_length": ("by_length", []), "trl_order": ("trl_order", [])} if args.compare == "order" else \
        {"by_length": ("by_length", [])} if args.compare == "none" else \
        {"micro_batch_4": ("by_length", []), "micro_batch_8": ("by_length", micro_batch_8())}
    results = {}
    from agentic_rag.malloc import child_env  # as the quick start starts its training processes

    env = child_env(dict(os.environ, OMP_NUM_THREADS=str(args.threads), AGENTIC_RAG_JVM_HEAP="1g",
                         TOKENIZERS_PARALLELISM="false"))
    for name, (variant, extra) in runs.items():
        cmd = [sys.executable, __file__, "--quickstart", str(qs), "--steps", str(args.steps), "--variant", variant,
               "--task", args.task]
        for kv in args.sets + extra:
            cmd += ["--set", kv]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            print(proc.stdout[-2000:], proc.stderr[-3000:], file=sys.stderr)
            return 1
        results[name] = json.loads(line[-1][len("RESULT "):])
        print(name, {k: v for k, v in results[name].items() if k != "micro_batches"}, flush=True)
    summary: dict = {"task": args.task, "sets": args.sets, "threads": args.threads, "compare": args.compare}
    if args.compare == "none":
        print(json.dumps({**summary, **results}))
        return 0
    first, second = list(results.values())
    if args.compare == "order":
        summary["scoring_forward_ratio"] = round(first["scoring_forward_s"] / max(1e-9, second["scoring_forward_s"]), 3)
    else:
        summary["peak_rss_ratio"] = round(first["peak_rss_gb"] / max(1e-9, second["peak_rss_gb"]), 3)
        summary["step_time_ratio"] = round(first["step_time_median_s"] / max(1e-9, second["step_time_median_s"]), 3)
    print(json.dumps({**summary, **results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
