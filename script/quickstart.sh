#!/usr/bin/env bash
# The main job on the embedded default, on a fresh machine (2 cores, no GPU is enough):
#   bash script/quickstart.sh [--seeds N] [--out DIR] [--steps N]
# installs what it needs (script/setup.sh), generates the fictional-world task and its BM25 index, makes a
# tiny model, warm-starts it with SFT, trains it with GRPO (searching mid-rollout) and a shuffled-reward control
# for each seed, evaluates before and after on held-out questions, and prints the table. Writes summary.json,
# reward_curve.png and SwanLab offline logs under DIR (default outputs/quickstart). See agentic_rag/demo/quickstart.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in -h|--help) sed -n '2,7p' "$0"; exit 0 ;; esac
bash "$ROOT/script/setup.sh"
source "$ROOT/script/_common.sh"
cd "$ROOT"
exec "$PY" -m agentic_rag.demo.quickstart "$@"
