#!/usr/bin/env bash
# Start the chat server with the settings in .env (AGENTIC_RAG_CHAT_*, documented in .env_format).
#   bash script/run_server.sh [extra flags, e.g. --port 8002]   (flags override .env)
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/_common.sh"
load_dotenv
# run from the caller's folder: relative paths (flags, .env values) are the caller's, as with any command
exec "$PY" "$ROOT/service/chat_server.py" "$@"
