# Shared by the scripts in script/: find the project root and the Python environment.
# Sourced, not run. Uses .venv when script/setup.sh made one, else the active interpreter.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -x "$ROOT/.venv/bin/python" ] && [ -z "${AGENTIC_RAG_NO_VENV:-}" ]; then
  PY="$ROOT/.venv/bin/python"
  export PATH="$ROOT/.venv/bin:$PATH"
else
  PY="${PYTHON:-python3}"
fi
# glibc asks for transparent huge pages on the large blocks it maps (agentic_rag.malloc: a third less CPU time in
# the kernel); read when a process starts, so set here for every script's Python. Your own GLIBC_TUNABLES win.
huge_pages() {
  if [ "${AGENTIC_RAG_MALLOC:-}" = "default" ]; then
    [ -n "${_AGENTIC_RAG_SET_TUNABLES:-}" ] && unset GLIBC_TUNABLES _AGENTIC_RAG_SET_TUNABLES
  elif [ -z "${GLIBC_TUNABLES+x}" ]; then
    export GLIBC_TUNABLES=glibc.malloc.hugetlb=1 _AGENTIC_RAG_SET_TUNABLES=1
  fi
  return 0
}
huge_pages
# Read the env file (variables documented in .env_format): $ENV_FILE when set, else .env when present; the
# environment wins over the file, and a blank value (KEY= as in the template) leaves KEY unset, so its default holds.
# A file named by ENV_FILE must exist, and a line that is not KEY=VALUE, a comment or blank stops the script with the
# file and the line number (not the line: it may hold a secret).
load_dotenv() {
  local f="${1:-${ENV_FILE:-$ROOT/.env}}"
  if [ ! -f "$f" ] && [ ! -c "$f" ]; then
    if [ -n "${1:-}${ENV_FILE:-}" ]; then
      echo "error: ENV_FILE names $f, which is not a file (unset ENV_FILE to read $ROOT/.env)" >&2
      exit 2
    fi
    return 0
  fi
  local line key n=0
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line="${line%%$'\r'}"
    [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
    line="${line#"${line%%[![:space:]]*}"}"
    line="${line#export }"
    key="${line%%=*}"; key="${key%"${key##*[![:space:]]}"}"
    [[ "$line" == *=* && "$key" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || {
      echo "error: $f line $n is not KEY=VALUE (a comment starts with #); fix or remove that line" >&2
      exit 2; }
    [ -n "${!key+x}" ] && continue
    local val="${line#*=}"
    val="${val#"${val%%[![:space:]]*}"}"
    if [[ "$val" =~ ^\"(.*)\"$ || "$val" =~ ^\'(.*)\'$ ]]; then val="${BASH_REMATCH[1]}"; fi
    [ -z "$val" ] && continue  # the template's KEY=: not set (an empty value would override the default)
    export "$key=$val"
  done < "$f"
  huge_pages  # the env file may say AGENTIC_RAG_MALLOC=default
}
