# Shared by the scripts in script/: find the project root and the Python environment.
# Sourced, not run. Uses .venv when script/setup.sh made one, else the active interpreter.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -x "$ROOT/.venv/bin/python" ] && [ -z "${AGENTIC_RAG_NO_VENV:-}" ]; then
  PY="$ROOT/.venv/bin/python"
  export PATH="$ROOT/.venv/bin:$PATH"
else
  PY="${PYTHON:-python3}"
fi
# Read .env when present (variables documented in .env_format); the environment wins over the file.
load_dotenv() {
  local f="${1:-$ROOT/.env}"
  [ -f "$f" ] || return 0
  local line key n=0
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line="${line%%$'\r'}"
    [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
    key="${line%%=*}"; key="${key// /}"
    # only the line number: the line may hold a secret (a value, or a key pasted without its name)
    [[ "$line" == *=* && "$key" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || {
      echo "ignoring malformed line $n in $f (expected KEY=VALUE)" >&2; continue; }
    [ -n "${!key+x}" ] && continue
    local val="${line#*=}"
    val="${val#"${val%%[![:space:]]*}"}"
    if [[ "$val" =~ ^\"(.*)\"$ || "$val" =~ ^\'(.*)\'$ ]]; then val="${BASH_REMATCH[1]}"; fi
    export "$key=$val"
  done < "$f"
}
