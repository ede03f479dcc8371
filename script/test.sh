#!/usr/bin/env bash
# Set up the environment (script/setup.sh) and run the whole test suite.
#   bash script/test.sh [extra pytest args]
# pytest's exit code 5 ("no tests collected") counts as a failure.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/script/setup.sh"
source "$ROOT/script/_common.sh"
cd "$ROOT"
"$PY" -m ruff check src tests service experiments docs/hooks
set +e
"$PY" -m pytest tests "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[test] pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
