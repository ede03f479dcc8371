#!/usr/bin/env bash
# GRPO training with DeepSpeed ZeRO-3 (weights sharded too: the way to fit 32B on two GPUs with QLoRA).
#   bash script/training/train_zero3.sh [CONFIG.yaml] [--resume] [--set KEY=VALUE ...]
# Settings come from .env (see .env_format) and the experiment YAML (default src/agentic_rag/resources/configs/world_grpo.yaml).
STAGE=3
source "$(dirname "${BASH_SOURCE[0]}")/_launch.sh"
