# CUDA smoke of the real commands on a tiny random Llama (SmolLM2's tokenizer): GRPO bf16 + checkpointing,
# GRPO QLoRA nf4, SFT bf16. Prints one line per check.
set -u
D=.devdata
python3 - <<'PY'
import json, torch
from transformers import LlamaConfig, LlamaForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(".devdata/sft")
cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=True)
torch.manual_seed(0)
LlamaForCausalLM(cfg).save_pretrained("/tmp/tiny"); tok.save_pretrained("/tmp/tiny")
print("tiny model saved")
PY
common="--config src/agentic_rag/resources/configs/wiki_grpo_smollm2.yaml --log-level WARNING --set model.name_or_path=/tmp/tiny --set model.tokenizer=/tmp/tiny --set model.adapter= --set data.train_file=$D/train.jsonl --set search.index=/tmp/idx --set logging.swanlab_mode=disabled --set logging.validation_file= --set algorithm.max_steps=2 --set algorithm.gradient_accumulation_steps=2 --set checkpoint.save_steps=2"
mkdir -p /tmp/idx && cp $D/manifest.json /tmp/idx/
for v in "bf16ckpt:--set model.dtype=auto --set model.gradient_checkpointing=true" "nf4:--set model.quantization=nf4 --set model.dtype=auto"; do
  name=${v%%:*}; extra=${v#*:}
  t0=$(date +%s)
  python3 -m agentic_rag.training.train $common $extra --set checkpoint.output_dir=/tmp/smoke_$name > $OUT/smoke_$name.log 2>&1
  rc=$?; echo "SMOKE grpo $name rc=$rc $(( $(date +%s)-t0 ))s adapter=$(ls /tmp/smoke_$name/final 2>/dev/null | grep -c adapter_model)"; tail -3 $OUT/smoke_$name.log
done
t0=$(date +%s)
python3 -m agentic_rag.cli sft --model /tmp/tiny --data $D/sft16.jsonl --out /tmp/smoke_sft --batch-size 4 --epochs 1 --max-turns 5 --max-tokens-per-turn 32 --max-completion-tokens 720 --passages-per-search 1 --max-observation-tokens 128 > $OUT/smoke_sft.log 2>&1
rc=$?; echo "SMOKE sft rc=$rc $(( $(date +%s)-t0 ))s"; tail -3 $OUT/smoke_sft.log
