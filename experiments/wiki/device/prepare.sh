#!/usr/bin/env bash
# Stage what a GPU screen of wiki recipes needs, in folders of the checkout that git ignores (run from the
# repository root): .whl (the pinned wheels the GPU image lacks, for its Python 3.12), .devdata (the quick start's
# data, SFT adapter and these scripts; bitsandbytes cut to its CUDA 13 library), .gg1 and .gg2 (the model's GGUF in
# two halves: one call carries at most 64 MiB). The order of the device calls: experiments/wiki/README.md.
#   bash experiments/wiki/device/prepare.sh outputs/quickstart_wiki [ADAPTER_DIR]
# ADAPTER_DIR: the SFT adapter the runs start from (default the quick start's sft/; OUT/sft_split for the sweep's
# abs recipes, which also need the GRPO half's files that recipes.py's split_sft writes).
set -euo pipefail
QS=${1:?usage: prepare.sh QUICKSTART_OUTPUT_DIR [ADAPTER_DIR]}
ADAPTER=${2:-$QS/sft}
HERE=experiments/wiki/device
EXCLUDE=$(git rev-parse --git-path info/exclude)
for d in /.whl/ /.devdata/ /.gg1/ /.gg2/; do grep -qxF "$d" "$EXCLUDE" 2>/dev/null || echo "$d" >> "$EXCLUDE"; done
rm -rf .whl .devdata .gg1 .gg2 && mkdir -p .whl .devdata/sft .devdata/site .gg1 .gg2
py312=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
       --platform manylinux1_x86_64)
python3 -m pip download -q "${py312[@]}" -d .whl transformers==5.23.0 tokenizers==0.23.3 huggingface_hub==2.4.0 \
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 trl==1.16.0 peft==0.21.2 accelerate==1.15.0 datasets==5.2.0 \
  dill==0.4.1 multiprocess==0.70.19 safetensors==0.8.0 pyjnius==1.9.0 gguf==0.19.0 bm25s==0.3.16 pystemmer==3.1.0
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_24_x86_64 \
  -d /tmp/bnb_wheel bitsandbytes==0.50.2
(cd .devdata/site && unzip -q -o /tmp/bnb_wheel/bitsandbytes-0.50.2-*.whl &&
 find bitsandbytes -name 'libbitsandbytes_*.so' ! -name '*cuda130*' ! -name '*cpu*' -delete)
cp "$QS"/data/train.jsonl "$QS"/data/validation.jsonl "$QS"/index/manifest.json .devdata/
gzip -c "$QS"/data/corpus.jsonl > .devdata/corpus.jsonl.gz
cp "$ADAPTER"/{adapter_config.json,adapter_model.safetensors,agentic_rag.json,chat_template.jinja,tokenizer.json,tokenizer_config.json} .devdata/sft/
if [ -f "$QS"/data/train_grpo_half.jsonl ]; then  # the abs recipes' training files (sweep.py SPLIT, SPLIT_MULTI)
  grep -v '"kind": "yes_no"' "$QS"/data/train_grpo_half.jsonl > .devdata/train_split_noyn.jsonl
  grep '"kind": "multi_hop"' "$QS"/data/train_grpo_half.jsonl > .devdata/train_split_multi.jsonl
fi
SFT_DATA=${SFT_DATA:-$QS/sft_data.jsonl}  # part_sft.py's weaker starts (SFT_DATA=QS/obs256/sft_data.jsonl: 256 tokens)
if [ -f "$SFT_DATA" ]; then
  cp "$SFT_DATA" .devdata/sft_data.jsonl && cp "$SFT_DATA.settings.json" .devdata/sft_data.jsonl.settings.json
  head -16 "$SFT_DATA" > .devdata/sft16.jsonl   # smoke.sh
fi
cp $HERE/sitecustomize.py $HERE/sweep.py $HERE/part_sft.py $HERE/smoke.sh .devdata/
GGUF=$("${PYTHON:-.venv/bin/python}" -c "from agentic_rag.models import packaged_model_file; print(packaged_model_file('smollm2-135m-instruct'))")
half=$(( ($(stat -c %s "$GGUF") + 1) / 2 ))
split -b "$half" "$GGUF" /tmp/gguf_part_ && mv /tmp/gguf_part_aa .gg1/p && mv /tmp/gguf_part_ab .gg2/p
du -sh .whl .devdata .gg1 .gg2
