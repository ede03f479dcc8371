#!/usr/bin/env bash
# Evaluate a policy on a benchmark from an evaluation config (resumable: rerun the same command after an
# interruption and finished questions are skipped).
#   bash script/evaluation/eval.sh CONFIG [agentic-rag eval options, e.g. --set policy.adapter=DIR --limit 50]
# Reads .env (see .env_format): the config may use ${EVAL_MODEL_PATH}, ${EVAL_BASE_URL}, ... and the API keys
# named by policy.api_key_env / judge.api_key_env.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/script/_common.sh"
load_dotenv
if [ $# -lt 1 ]; then
  echo "usage: bash script/evaluation/eval.sh CONFIG [options]" >&2
  exit 2
fi
# run from the caller's folder: a relative config, model or output path is the caller's, not the checkout's
exec "$PY" -m agentic_rag.cli eval --config "$@"
