#!/usr/bin/env bash
# A recorded session of the terminal client with the chat service serving the quick start's trained agent:
# the packaged SmolLM2-135M-Instruct (GGUF) with a GRPO adapter, searching the quick start world's BM25 index.
#
#   bash experiments/service/transcript.sh [QUICKSTART_DIR] [SEED] [N_QUESTIONS]
#
# The server is started exactly as a user would start it, with no rollout options: it reads the settings the
# adapter was trained with (agentic_rag.json next to the adapter: dialect, system prompt, chat template, turns,
# searches, passages per search, observation budget) and fits its token defaults to the model's context. The
# client is the interactive one, fed the first N held-out questions (half one-hop, half two-hop) on its stdin,
# each after /reset (a new conversation); it prints each reply's searches and answer. Writes transcript.txt (and server.log) next to this file.
set -euo pipefail
cd "$(dirname "$0")/../.."
QS=${1:-outputs/quickstart}
SEED=${2:-0}
N=${3:-6}
PORT=${AGENTIC_RAG_CHAT_PORT:-8011}
PY=${PYTHON:-.venv/bin/python}
HERE=experiments/service
ADAPTER="$QS/runs/seed$SEED-grpo/final"
[ -f "$ADAPTER/adapter_config.json" ] || { echo "no GRPO adapter at $ADAPTER: run the quick start first" >&2; exit 1; }

"$PY" service/chat_server.py --model smollm2-135m-instruct --adapter "$ADAPTER" --index "$QS/index" \
    --port "$PORT" > "$HERE/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 $SERVER 2>/dev/null || { echo "the server exited; see $HERE/server.log" >&2; tail -20 "$HERE/server.log" >&2; exit 1; }
    sleep 1
done
QUESTIONS=$("$PY" - "$QS/world/test.jsonl" "$N" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
n = int(sys.argv[2])
one = [r for r in rows if r["hops"] == 1][: (n + 1) // 2]
two = [r for r in rows if r["hops"] == 2][: n // 2]
for r in one + two:
    print(r["question"])
PY
)
{
    echo "# $(date -u +%Y-%m-%dT%H:%MZ)  server: service/chat_server.py --model smollm2-135m-instruct --adapter $ADAPTER --index $QS/index"
    echo "# client: service/chat_client.py --no-color, questions on stdin (held-out questions of $QS/world/test.jsonl)"
    echo "# the gold answers, for the reader:"
    "$PY" - "$QS/world/test.jsonl" <<PY
import json, sys
gold = {json.loads(l)["question"]: json.loads(l)["answer"] for l in open(sys.argv[1])}
for q in """$QUESTIONS""".splitlines():
    print(f"#   {q} -> {gold[q]}")
PY
    echo
    # /reset before each question: the agent was trained on one question per conversation, and the interactive
    # client otherwise sends the whole conversation so far (a first recording without it: the two questions
    # after the first two answers got no search and a wrong answer)
    printf '%s\n' "$QUESTIONS" | sed 's|^|/reset\n|' | "$PY" service/chat_client.py --url "http://127.0.0.1:$PORT" --no-color
} 2>&1 | tee "$HERE/transcript.txt"
