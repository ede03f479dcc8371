#!/usr/bin/env bash
# Re-score any system's predictions with the project's normalisation; prints {n, em, f1, cover_em}.
# Reads .env (see .env_format) like the other evaluation scripts.
#   bash script/evaluation/score.sh PREDICTIONS.jsonl [--pred-field F --answer-field F]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/script/_common.sh"
load_dotenv
if [ $# -lt 1 ]; then
  echo "usage: bash script/evaluation/score.sh PREDICTIONS.jsonl [--pred-field F --answer-field F]" >&2
  exit 2
fi
file="$1"; shift
exec "$PY" -m agentic_rag.cli score --predictions "$file" "$@"
