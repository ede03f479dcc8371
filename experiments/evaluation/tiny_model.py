"""Write a tiny random-init model and a random LoRA adapter to disk, to run the evaluation pipeline end to end
without downloading anything.

    python experiments/evaluation/tiny_model.py --out outputs/tiny-qwen [--seed 0]

``OUT/model``: a 2-layer Qwen2-architecture model (hidden 64) over the real Qwen2 vocabulary and the Qwen3
tokenizer config (ChatML template) from ../shared/data; ``OUT/adapter``: a LoRA adapter (r 8, q/k/v/o
projections) with random, non-zero weights, as peft saves it. Random weights answer nothing correctly: the
scores of a run with them are ~0 by construction; the point is the pipeline, the files and the report.
The last line printed is one JSON object with both paths.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("AGENTIC_RAG_SHARED_DATA", ROOT.parent / "shared" / "data"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "outputs" / "tiny-qwen"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("vocab.json", "merges.txt"):
            shutil.copy(SHARED / "rtp-llm-qwen-tokenizer" / "qwen2_tokenizer" / name, Path(tmp) / name)
        shutil.copy(SHARED / "rtp-llm-qwen-tokenizer" / "qwen3_30b_tokenizer_config" / "tokenizer_config.json",
                    Path(tmp) / "tokenizer_config.json")
        tok = AutoTokenizer.from_pretrained(tmp)
    torch.manual_seed(args.seed)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    lora = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    lora.save_pretrained(out / "adapter")
    print(json.dumps({"model": str(out / "model"), "adapter": str(out / "adapter")}))


if __name__ == "__main__":
    main()
