#!/usr/bin/env bash
# The evaluation pipeline end to end on CPU with a tiny random-init model (scores ~0 by construction):
# re-score R1-Searcher's released predictions, build a HotpotQA BM25 index, evaluate the tiny model without
# and with a random LoRA adapter, and compare the two runs in a report.
#   bash experiments/evaluation/run_tiny.sh        (results: experiments/evaluation/results/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/script/_common.sh"
cd "$ROOT"
DATA="${AGENTIC_RAG_SHARED_DATA:-$ROOT/../shared/data}"
RES="$ROOT/experiments/evaluation/results"
mkdir -p "$RES"
ar() { "$PY" -m agentic_rag.cli --log-level WARNING "$@"; }

ar score --predictions "$DATA/r1-searcher/eval_results/hotpotqa_llama.jsonl" --pred-field pred_ans \
  --answer-field answer | tee "$RES/score_hotpotqa_llama.json"
"$PY" experiments/evaluation/tiny_model.py --out outputs/tiny-qwen
ar index build --corpus "$DATA/hipporag/hotpotqa_train_corpus.json" --out outputs/indexes/hotpotqa --bm25
small=(--limit 30 --no-progress --set rollout.max_tokens_per_turn=64 --set rollout.max_completion_tokens=256
       --set policy.device=cpu)
EVAL_MODEL_PATH=outputs/tiny-qwen/model ar eval --config experiments/evaluation/hotpotqa_bm25.yaml "${small[@]}" \
  --set name=tiny-base --output-dir runs/eval/tiny-base | tail -n 1 > /dev/null
EVAL_MODEL_PATH=outputs/tiny-qwen/model EVAL_ADAPTER_PATH=outputs/tiny-qwen/adapter \
  ar eval --config experiments/evaluation/hotpotqa_bm25.yaml "${small[@]}" \
  --set name=tiny-lora --output-dir runs/eval/tiny-lora | tail -n 1 > /dev/null
for run in tiny-base tiny-lora; do
  "$PY" - "$run" "$RES/$run.summary.json" <<'PY'
import json, sys
s = json.load(open(f"runs/eval/{sys.argv[1]}/summary.json"))
s.pop("config", None)
json.dump(s, open(sys.argv[2], "w"), indent=2)
PY
done
ar eval-report --runs runs/eval/tiny-base runs/eval/tiny-lora --out "$RES/tiny_report.md"
