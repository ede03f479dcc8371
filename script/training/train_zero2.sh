#!/usr/bin/env bash
# GRPO training with DeepSpeed ZeRO-2 (gradients and optimizer states sharded across GPUs).
#   bash script/training/train_zero2.sh [CONFIG.yaml] [--resume] [--set KEY=VALUE ...]
# Settings come from .env (see .env_format) and the experiment YAML (default src/agentic_rag/resources/configs/world_grpo.yaml).
STAGE=2
source "$(dirname "${BASH_SOURCE[0]}")/_launch.sh"
