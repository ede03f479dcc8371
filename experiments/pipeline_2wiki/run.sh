#!/usr/bin/env bash
# The quick start's pipeline on a real corpus: 2WikiMultiHopQA passages (BM25) and questions, a tiny model with
# the real Qwen2 tokenizer: index -> SFT warm start -> evaluate -> GRPO with search mid-rollout -> evaluate.
#   bash experiments/pipeline_2wiki/run.sh     (outputs under outputs/pipeline_2wiki; results/ records the run)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/script/_common.sh"
cd "$ROOT"
DATA="${AGENTIC_RAG_SHARED_DATA:-$ROOT/../shared/data}"
OUT=outputs/pipeline_2wiki
HERE=experiments/pipeline_2wiki
cli() { "$PY" -m agentic_rag.cli --log-level WARNING "$@"; }
rm -rf "$OUT" && mkdir -p "$OUT" "$HERE/results"
echo "== index (reused when up to date)"
cli index build --corpus "$DATA/hipporag/2wikimultihopqa_corpus.json" --out outputs/indexes/2wiki --bm25
echo "== questions, tiny model, expert trajectories"
"$PY" "$HERE/prepare.py" --data "$DATA" --index outputs/indexes/2wiki --out "$OUT"
echo "== SFT warm start"
cli sft --model "$OUT/init" --data "$OUT/sft_data.jsonl" --out "$OUT/sft" --full --chat false --epochs 12 --lr 1e-3 --batch-size 8
echo "== evaluate the SFT model"
cli eval --config "$HERE/eval.yaml" --set policy.model="$OUT/sft" --output-dir "$OUT/eval/sft" --no-progress
echo "== GRPO"
cli train --config "$HERE/grpo.yaml"
echo "== evaluate the GRPO adapter"
cli eval --config "$HERE/eval.yaml" --set policy.model="$OUT/sft" --set policy.adapter="$OUT/grpo/final" \
  --output-dir "$OUT/eval/grpo" --no-progress
"$PY" - "$OUT" "$HERE/results/summary.json" <<'PY'
import json, sys
out, dest = sys.argv[1], sys.argv[2]
train = json.load(open(f"{out}/grpo/train_summary.json"))
steps = [h for h in train["log_history"] if "reward" in h]
rec = {"grpo_steps": train["global_step"],
       "rewards": [h.get("reward") for h in steps],
       "reward_per_function": {k.split("/")[1]: [h[k] for h in steps] for k in steps[0]
                               if k.startswith("rewards/") and k.endswith("/mean")} if steps else {},
       "searches_per_rollout": [h.get("agentic/searches_per_trajectory") for h in train["log_history"] if "reward" in h]}
for name in ("sft", "grpo"):
    s = json.load(open(f"{out}/eval/{name}/summary.json"))
    rec[name] = {"n": s["n"], "metrics": s["metrics"], "searches_per_question": s["searches_per_question"],
                 "finish_reasons": s["finish_reasons"], "search_errors": s["search_errors"]}
json.dump(rec, open(dest, "w"), indent=1)
print(json.dumps(rec))
PY
