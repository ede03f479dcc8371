"""What a heap stretch around the rollout engine would save when a CPU model decodes, and what it costs in memory:
the wiki quick start's evaluation, side by side with and without it (not shipped: see ``agentic_rag.malloc``).

    python experiments/benchmarks/decoding_heap.py --quickstart outputs/quickstart_wiki [--questions 64]
    python experiments/benchmarks/decoding_heap.py --quickstart outputs/quickstart_wiki --questions 32 --samples 4 \
        --thresholds 32,256

Each variant runs in a fresh process (``OMP_NUM_THREADS`` = ``--threads``, default 2, and glibc's huge-page tunable,
as the quick start's processes) under the entry points' 1 MiB mmap threshold (:mod:`agentic_rag.malloc`), and
evaluates the first ``--questions`` validation questions greedily with the quick start's SFT adapter, twice, as the
quick start does (one batch of up to 128 rows, Pyserini BM25 on ``QUICKSTART/index``), into a temporary directory;
with ``--samples N``, the first ``--questions`` multi-hop validation questions N times each at temperature 1, as the
quick start's sampled evaluation of its SFT adapter (32 questions x 4 rollouts, 128 rows):

* ``mapped``: as shipped: every block of 1 MiB or more (each step's logits, the prefill of each observation, the KV
  cache's buffers) is mapped and faulted in anew;
* ``stretch_<MiB>``, for each of ``--thresholds`` (default 32 and 256): every ``AgentRollout.run`` inside
  ``heap_for_blocks_below(<MiB> << 20)``, the heap trimmed when it returns;
* ``glibc``: ``AGENTIC_RAG_MALLOC=default``, glibc's own dynamic threshold, for reference.

Per variant: seconds of each evaluation, the process's user and system CPU seconds, its peak RSS, the heap's
resident size after (``/proc/self/smaps``) and the EM of each evaluation (the same in every variant: the stretch
changes where memory comes from, not what is computed). The last line printed is one JSON object with every variant
and ``time_ratio`` and ``peak_rss_ratio`` (each stretch / mapped; times of the second evaluations).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def heap_resident_mb() -> int:
    """The resident size of the process's [heap] mapping, in MB."""
    kb, name = 0, None
    for line in open("/proc/self/smaps"):
        parts = line.split()
        if "-" in parts[0] and len(parts) >= 5 and ":" in parts[3]:
            name = parts[5] if len(parts) > 5 else None
        elif parts[0] == "Rss:" and name == "[heap]":
            kb += int(parts[1])
    return kb // 1024


def measure(quickstart: Path, questions: int, variant: str, samples: int = 1, model_name: str | None = None) -> dict:
    import resource

    from agentic_rag.malloc import release_freed_memory
    from agentic_rag.training.train import peak_rss_mb

    applied = release_freed_memory()
    from agentic_rag.demo import wiki
    from agentic_rag.demo.quickstart import models_of
    from agentic_rag.rollout.engine import AgentRollout

    if variant.startswith("stretch_"):
        from agentic_rag.malloc import heap_for_blocks_below

        threshold, run = int(variant.split("_")[1]) << 20, AgentRollout.run

        def stretched(self, *a, **k):
            with heap_for_blocks_below(threshold):
                return run(self, *a, **k)
        AgentRollout.run = stretched
    s = wiki.WikiSettings(out=quickstart, seeds=[0], fast=True, **({"model": model_name} if model_name else {}))
    model, adapter = models_of(s, quickstart / "sft")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        work = wiki.WikiSettings(out=Path(tmp), seeds=[0], fast=True)
        for d in ("index", "data"):
            os.symlink(quickstart / d, work.out / d)
        subset = work.out / "questions.jsonl"
        lines = [x for x in open(s.validation_file) if samples == 1 or json.loads(x)["kind"] == "multi_hop"]
        subset.write_text("".join(lines[:questions]))
        for i in range(2):
            t = time.perf_counter()
            summary = wiki.evaluate(work, f"bench{i}", model, adapter, questions=subset, samples=samples)
            runs.append({"seconds": round(time.perf_counter() - t, 1), "em": summary["metrics"]["em"]})
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"variant": variant, "threshold_applied": applied, "evaluations": runs,
            "user_cpu_s": round(usage.ru_utime, 1), "system_cpu_s": round(usage.ru_stime, 1),
            "peak_rss_gb": round(peak_rss_mb() / 1024, 2), "heap_resident_after_mb": heap_resident_mb()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quickstart", default="outputs/quickstart_wiki", help="a wiki quick start's output directory")
    ap.add_argument("--questions", type=int, default=64, help="validation questions per evaluation (default 64)")
    ap.add_argument("--threads", type=int, default=2, help="OMP threads of each measured process (default 2)")
    ap.add_argument("--samples", type=int, default=1, help="rollouts a question (default 1: greedy; more: temperature "
                    "1 on multi-hop questions)")
    ap.add_argument("--thresholds", default="32,256", help="comma-separated stretch thresholds in MiB (default "
                    "32,256)")
    ap.add_argument("--model", default=None, help="the base model of QUICKSTART/sft (default: the wiki quick start's, "
                    "the packaged SmolLM2-135M-Instruct; a model directory for a smoke run with a tiny model)")
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    args = ap.parse_args()
    qs = Path(args.quickstart).resolve()
    if not (qs / "sft" / "adapter_config.json").exists() or not (qs / "index").is_dir():
        ap.error(f"no SFT adapter and index in {qs}: run the wiki quick start first "
                 "(bash script/quickstart.sh --task wiki)")
    if args.variant:
        print("RESULT " + json.dumps(measure(qs, args.questions, args.variant, args.samples, args.model)), flush=True)
        return 0
    from agentic_rag.malloc import child_env

    env = child_env(dict(os.environ, OMP_NUM_THREADS=str(args.threads), AGENTIC_RAG_JVM_HEAP="1g",
                         TOKENIZERS_PARALLELISM="false"))
    env = {k: v for k, v in env.items() if not k.startswith("MALLOC_") and k != "AGENTIC_RAG_MALLOC"}
    results = {}
    stretches = [f"stretch_{int(t)}" for t in args.thresholds.split(",") if t.strip()]
    for variant in ["mapped", *stretches, "glibc"]:
        extra = {"AGENTIC_RAG_MALLOC": "default"} if variant == "glibc" else {}
        out = subprocess.run([sys.executable, __file__, "--quickstart", str(qs), "--questions", str(args.questions),
                              "--samples", str(args.samples), "--variant", variant,
                              *(["--model", args.model] if args.model else [])], env={**env, **extra},
                             capture_output=True, text=True)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if out.returncode or not line:
            sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
            raise SystemExit(f"the {variant} run failed (exit {out.returncode})")
        results[variant] = json.loads(line[-1][len("RESULT "):])
        print(json.dumps(results[variant]), flush=True)
    second = {v: r["evaluations"][1]["seconds"] for v, r in results.items()}
    print(json.dumps({"questions": args.questions, "samples": args.samples, "threads": args.threads,
                      "variants": results,
                      "time_ratio": {v: round(second[v] / second["mapped"], 3) for v in stretches},
                      "peak_rss_ratio": {v: round(results[v]["peak_rss_gb"] / results["mapped"]["peak_rss_gb"], 3)
                                         for v in stretches}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
