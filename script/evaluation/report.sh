#!/usr/bin/env bash
# Compare evaluation runs side by side: a markdown table and a bar chart (OUT.md + OUT.png).
# Reads .env (see .env_format) like the other evaluation scripts.
#   bash script/evaluation/report.sh OUT.md RUN_DIR [RUN_DIR ...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/script/_common.sh"
load_dotenv
if [ $# -lt 2 ]; then
  echo "usage: bash script/evaluation/report.sh OUT.md RUN_DIR [RUN_DIR ...]" >&2
  exit 2
fi
out="$1"; shift
exec "$PY" -m agentic_rag.cli eval-report --out "$out" --runs "$@"
