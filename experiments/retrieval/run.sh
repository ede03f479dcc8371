#!/usr/bin/env bash
# Retrieval quality on the 2WikiMultiHopQA corpus and its 500 dev questions, for bm25, dense and hybrid.
#   bash experiments/retrieval/run.sh      (writes experiments/retrieval/results/*.json)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/script/_common.sh"
DATA="${AGENTIC_RAG_SHARED_DATA:-$ROOT/../shared/data}"
INDEX="$ROOT/outputs/indexes/2wiki"
RES="$ROOT/experiments/retrieval/results"
mkdir -p "$RES"
"$PY" -m agentic_rag.cli --log-level WARNING index build --corpus "$DATA/hipporag/2wikimultihopqa_corpus.json" \
  --out "$INDEX" --bm25 --dense-encoder minilm
for r in bm25 dense hybrid; do
  "$PY" -m agentic_rag.cli --log-level WARNING eval-retrieval --index "$INDEX" --retriever "$r" \
    --questions "$DATA/tts-project/2wikimultihopqa_dev500.json" --k 1,5,10,20 --output "$RES/$r.json"
done
"$PY" "$ROOT/experiments/retrieval/hybrid_grid.py" --index "$INDEX" \
  --questions "$DATA/tts-project/2wikimultihopqa_dev500.json" > "$RES/hybrid_grid.jsonl"
