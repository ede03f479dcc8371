"""SFT of the real model on a random part of the wiki quick start's gold trajectories, on the lent GPU: a weaker
SFT start for GRPO to climb from (the full epoch saturates what 12 GRPO steps can move). The quick start's own SFT
settings (LoRA r 16, alpha 32, lr 5e-4, batch 8, length-grouped) except the number of trajectories, the number of
epochs (1 unless given) and no gradient checkpointing (the GPU has the memory). N at least the file's 764 lines takes
them all: a stronger start, with EPOCHS > 1. Writes OUT_DIR.done when the adapter is complete (sweep.py waits on it).

    python3 part_sft.py N OUT_DIR [EPOCHS]   (reads .devdata/sft_data.jsonl and its settings sidecar)
"""

import json
import random
import shutil
import sys
from pathlib import Path

from agentic_rag.demo import wiki
from agentic_rag.training.sft import run_sft

n, out = int(sys.argv[1]), Path(sys.argv[2])
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
lines = open(".devdata/sft_data.jsonl").readlines()
part = Path(f"/tmp/sft_part{n}.jsonl")
part.write_text("".join(random.Random(0).sample(lines, min(n, len(lines)))))
shutil.copy(".devdata/sft_data.jsonl.settings.json", f"{part}.settings.json")
s = wiki.WikiSettings(out=Path("/tmp/part_sft"), seeds=[0], fast=True)
summary = run_sft(
    model="smollm2-135m-instruct",
    data=str(part),
    output_dir=str(out),
    rollout=wiki._rollout(s),
    prompt=wiki._prompt(s),
    epochs=epochs,
    learning_rate=5e-4,
    seed=0,
    resume=None,
    gradient_checkpointing=False,
    save_steps=0,
    progress=False,
    batch_size=8,
    lora_r=16,
    lora_alpha=32,
    logging_steps=1,
    group_by_length=True,
)
Path(f"{out}.done").write_text("")
print(json.dumps({"n": n, "epochs": epochs, "train_runtime": summary.get("train_runtime_s"),
                  "loss": summary.get("train_loss")}))
