# Shared by train_zero2.sh and train_zero3.sh (sourced with STAGE set): read .env, pick the accelerate
# config for the hardware, and launch the trainer with DeepSpeed ZeRO-$STAGE.
#
# .env (see .env_format): MODEL_PATH, INDEX_DIR or SEARCH_URL, NUM_GPUS, JUDGE_BASE_URL / JUDGE_MODEL /
# JUDGE_API_KEY, SWANLAB_MODE / SWANLAB_PROJECT / SWANLAB_API_KEY / SWANLAB_LOG_DIR, OUTPUT_DIR, TRAIN_CONFIG.
# Without a GPU (or with USE_CPU=1) it runs NUM_PROCESSES (default 2) CPU processes over gloo.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../_common.sh"
load_dotenv
# run from the caller's folder: a relative config, model or output path is the caller's, not the checkout's (the
# defaults below name the checkout's files by their full path)

CONFIG="${TRAIN_CONFIG:-$ROOT/src/agentic_rag/resources/configs/world_grpo.yaml}"
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then CONFIG="$1"; shift; fi
[ -f "$CONFIG" ] || { echo "no such training config: $CONFIG" >&2; exit 2; }

has_gpu=0
if [ -z "${USE_CPU:-}" ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then has_gpu=1; fi
if [ "$has_gpu" = 1 ]; then
  ACCEL="$ROOT/experiments/training/accelerate/zero${STAGE}.yaml"
  NPROC="${NUM_GPUS:-$(nvidia-smi -L | wc -l)}"
else
  ACCEL="$ROOT/experiments/training/accelerate/zero${STAGE}_cpu.yaml"
  NPROC="${NUM_PROCESSES:-2}"
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
export TOKENIZERS_PARALLELISM=false
# The accelerate configs name only a DeepSpeed config file, so accelerate does not export the stage itself; the
# trainer's pre-load memory estimate reads it from here (DeepSpeed's own stage comes from the JSON file).
export ACCELERATE_DEEPSPEED_ZERO_STAGE="$STAGE"
echo "[train] ZeRO-$STAGE on $NPROC $( [ "$has_gpu" = 1 ] && echo GPU || echo CPU) process(es): $CONFIG" >&2
exec "$PY" -m accelerate.commands.launch --config_file "$ACCEL" --num_processes "$NPROC" \
  --deepspeed_config_file "$ROOT/experiments/training/deepspeed/zero${STAGE}.json" \
  --main_process_port "${MAIN_PROCESS_PORT:-0}" \
  -m agentic_rag.training.train --config "$CONFIG" "$@"
