"""Peak memory and CPU time of `agentic-rag sft`, glibc's default allocator settings against agentic_rag.malloc's,
with and without transparent huge pages for the mapped blocks.

    python experiments/benchmarks/sft_memory.py --data TRAJ.jsonl [--batch-size 8] [--no-gradient-checkpointing]
        [--model smollm2-135m-instruct]

Runs the same SFT (the packaged SmolLM2-135M-Instruct, or ``--model``; LoRA r 16, one epoch of DATA) three times,
one after the other:
with ``AGENTIC_RAG_MALLOC=default`` (glibc's dynamic mmap threshold), with the fixed 1 MiB threshold the entry
points set, and with that threshold and ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (the scripts' setting: glibc asks
for transparent huge pages on the blocks it maps, so a fresh 30 MiB block costs 15 page faults instead of 7,680).
Each run's peak RSS and user/system CPU seconds come from ``os.wait4`` on that child alone. Make DATA
with ``agentic-rag trajectories`` (e.g. the longest trajectories of the wiki quick start's ``sft_data.jsonl``; its
``.settings.json`` must lie beside it). Prints one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_sft(data: str, batch_size: int, gc: bool, malloc: str, hugetlb: bool,
            model: str = "smollm2-135m-instruct") -> dict:
    out = Path(tempfile.mkdtemp(prefix="sft_memory_")) / "sft"
    cmd = [sys.executable, "-m", "agentic_rag.cli", "sft", "--model", model, "--data", data,
           "--out", str(out), "--epochs", "1", "--lr", "5e-4", "--lora-r", "16", "--lora-alpha", "32",
           "--save-steps", "0", "--batch-size", str(batch_size),
           "--gradient-checkpointing" if gc else "--no-gradient-checkpointing"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env["AGENTIC_RAG_MALLOC"] = malloc
    if hugetlb:
        env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    shutil.rmtree(out.parent, ignore_errors=True)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"sft failed ({malloc}):\n{output[-3000:]}")
    return {"peak_rss_gib": round(usage.ru_maxrss / 2**20, 2), "user_s": round(usage.ru_utime, 1),
            "sys_s": round(usage.ru_stime, 1), "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="token-level trajectories (agentic-rag trajectories output)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--no-gradient-checkpointing", dest="gc", action="store_false")
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="the base model SFT trains (default: the packaged smollm2-135m-instruct; a directory for a "
                         "smoke run with a tiny model)")
    args = ap.parse_args()
    runs = {}
    for name, malloc, hugetlb in (("default", "default", False), ("on", "on", False), ("on_hugetlb", "on", True)):
        runs[name] = run_sft(args.data, args.batch_size, args.gc, malloc, hugetlb, args.model)
        print(name, runs[name], flush=True)
    d, o, h = runs["default"], runs["on"], runs["on_hugetlb"]

    def cpu(r: dict) -> float:
        return r["user_s"] + r["sys_s"]

    print(json.dumps({"data": args.data, "model": args.model, "batch_size": args.batch_size,
                      "gradient_checkpointing": args.gc,
                      "glibc_default": d, "fixed_threshold": o, "fixed_threshold_hugetlb": h,
                      "peak_rss_ratio": round(o["peak_rss_gib"] / d["peak_rss_gib"], 3),
                      "cpu_s_ratio": round(cpu(o) / cpu(d), 3),
                      "hugetlb_peak_rss_ratio": round(h["peak_rss_gib"] / d["peak_rss_gib"], 3),
                      "hugetlb_cpu_s_ratio": round(cpu(h) / cpu(d), 3),
                      "hugetlb_wall_ratio": round(h["wall_s"] / d["wall_s"], 3)}))


if __name__ == "__main__":
    main()
