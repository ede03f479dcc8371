#!/usr/bin/env bash
# R1-Searcher's released Llama-3.1-8B replayed from its 500 recorded HotpotQA rollouts through the whole
# evaluation pipeline (endpoint policy -> engine with a real BM25 index -> scorer), once with a server that
# does not say which stop string matched and once with vLLM's stop_reason. Needs run_tiny.sh's tokenizer
# and index (outputs/tiny-qwen/model, outputs/indexes/hotpotqa).
#   bash experiments/evaluation/run_replay.sh        (results: experiments/evaluation/results/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/script/_common.sh"
cd "$ROOT"
DATA="${AGENTIC_RAG_SHARED_DATA:-$ROOT/../shared/data}"
RES="$ROOT/experiments/evaluation/results"
mkdir -p "$RES"
for mode in generic vllm; do
  flag=(); [ "$mode" = vllm ] && flag=(--vllm)
  "$PY" experiments/evaluation/replay_server.py --rollouts "$DATA/r1-searcher/eval_results/hotpotqa_llama.jsonl" \
    --port 8011 "${flag[@]}" &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  sleep 2
  "$PY" -m agentic_rag.cli --log-level WARNING eval --config experiments/evaluation/replay_r1searcher.yaml \
    --no-progress --overwrite --set "name=replay-$mode" --output-dir "runs/eval/replay-$mode" | tail -n 1 > /dev/null
  kill "$server"; wait "$server" 2>/dev/null || true
  "$PY" - "runs/eval/replay-$mode/summary.json" "$RES/replay-$mode.summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s.pop("config", None)
json.dump(s, open(sys.argv[2], "w"), indent=2)
PY
done
"$PY" -m agentic_rag.cli eval-report --runs runs/eval/replay-generic runs/eval/replay-vllm --out "$RES/replay_report.md"
