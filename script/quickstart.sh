#!/usr/bin/env bash
# The main job on the embedded default, on a fresh machine:
#   bash script/quickstart.sh [--seed N] [--out DIR]
# installs what it needs (script/setup.sh), generates the fictional-world task, builds its BM25 index,
# and answers a held-out question by searching.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SEED=0
OUT="$ROOT/outputs/quickstart"
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) SEED="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
bash "$ROOT/script/setup.sh"
source "$ROOT/script/_common.sh"
cli() { "$PY" -m agentic_rag.cli --log-level WARNING "$@"; }

echo "== 1. generate the fictional world (seed $SEED)"
cli world --out "$OUT/world" --seed "$SEED"
echo "== 2. build its BM25 index"
cli index build --corpus "$OUT/world/corpus.json" --out "$OUT/index" --bm25
echo "== 3. search for a held-out question"
QUESTION="$("$PY" -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(r["question"]); print(r["answer"], file=sys.stderr)' "$OUT/world/test.jsonl" 2>"$OUT/answer.txt")"
echo "question: $QUESTION   (gold answer: $(cat "$OUT/answer.txt"))"
cli search --index "$OUT/index" -k 3 "$QUESTION"
