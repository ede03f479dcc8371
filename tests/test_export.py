"""``agentic-rag export`` on the real SmolLM2-135M-Instruct (``smollm2-135m-instruct``), on a CPU: a random nonzero
LoRA adapter is saved as training saves one (adapter, tokenizer with a chat template of its own, agentic_rag.json),
exported by the command line as a user runs it, and the folder is loaded back with plain transformers (no peft, no
agentic-rag): greedy generation matches base + adapter through peft token for token, and differs from the base
alone. The refusals (nothing to merge, a folder of the user's) are one line and exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

SMOL = "smollm2-135m-instruct"
PROMPTS = ["What is the capital of France?", "Name three colours of the rainbow.",
           "Who wrote the play Hamlet? Answer in one sentence."]
NEW_TOKENS = 24
# appended to the base template: renders the same, but only the adapter folder's tokenizer carries it
ADAPTER_TEMPLATE_MARK = "{#- the adapter's own chat template #}"


@dataclass
class Exported:
    adapter: Path
    out: Path
    tokenizer: Any  # the adapter folder's tokenizer
    peft_model: Any  # base + adapter, unmerged
    proc: subprocess.CompletedProcess


def export_cli(*args: str | Path) -> subprocess.CompletedProcess:
    """``agentic-rag export ARGS`` in a process of its own, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "agentic_rag.cli", "--log-level", "WARNING", "export",
                           *map(str, args)], capture_output=True, text=True, timeout=300)


def greedy(model: Any, tok: Any, prompt: str) -> list[int]:
    """The token ids of the greedy reply to ``prompt`` through ``tok``'s chat template (prompt ids included)."""
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
    return out[0].tolist()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Exported:
    from peft import LoraConfig, get_peft_model

    from agentic_rag.models import load_causal_lm, load_tokenizer
    from agentic_rag.rollout import RolloutSettings
    from agentic_rag.rollout.settings import PromptSettings
    from agentic_rag.rollout.trained_settings import write_settings

    tmp = tmp_path_factory.mktemp("export")
    tok = load_tokenizer(SMOL, padding_side="right")
    tok.chat_template = tok.chat_template + ADAPTER_TEMPLATE_MARK
    base = load_causal_lm(SMOL, dtype="float32", device="cpu")
    torch.manual_seed(0)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))  # random A and B: the adapter acts
    peft_model.eval()
    adapter = tmp / "adapter"
    peft_model.save_pretrained(str(adapter))
    tok.save_pretrained(str(adapter))
    write_settings(adapter, RolloutSettings(max_searches=2),
                   PromptSettings(system_prompt="Answer the question by searching.", chat_template=True),
                   written_by="sft")
    out = tmp / "merged"
    proc = export_cli("--adapter", adapter, "--out", out)
    return Exported(adapter, out, tok, peft_model, proc)


def test_export_writes_a_plain_model_folder(exported):
    assert exported.proc.returncode == 0, exported.proc.stderr
    assert json.loads((exported.adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == SMOL
    out = exported.out
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "agentic_rag.json"):
        assert (out / name).is_file(), name
    assert not (out / "adapter_config.json").exists() and not out.with_name(out.name + ".partial").exists()
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert (out / "agentic_rag.json").read_bytes() == (exported.adapter / "agentic_rag.json").read_bytes()
    line = exported.proc.stdout.strip().splitlines()[-1]  # the summary (deepspeed, when installed, talks before it)
    assert line.startswith("exported ") and str(out) in line and "MB" in line and "float32" in line, line


def test_merged_model_generates_exactly_as_base_plus_adapter(exported):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert exported.proc.returncode == 0, exported.proc.stderr
    merged = AutoModelForCausalLM.from_pretrained(str(exported.out), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(exported.out))
    assert tok.chat_template == exported.tokenizer.chat_template
    assert ADAPTER_TEMPLATE_MARK in tok.chat_template  # the adapter folder's tokenizer, not the base model's
    differs = 0
    for prompt in PROMPTS:
        want = greedy(exported.peft_model, exported.tokenizer, prompt)
        got = greedy(merged, tok, prompt)
        assert got == want, prompt
        with exported.peft_model.disable_adapter():
            differs += greedy(exported.peft_model, exported.tokenizer, prompt) != want
    assert differs >= 1, "the adapter changes nothing: the test could not tell a merge from no merge"


def test_a_full_model_folder_has_nothing_to_merge(exported, tmp_path):
    assert exported.proc.returncode == 0, exported.proc.stderr
    proc = export_cli("--adapter", exported.out, "--out", tmp_path / "again")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "nothing to merge" in lines[0] and str(exported.out) in lines[0]
    assert not (tmp_path / "again").exists()


def test_a_folder_of_the_users_is_refused(exported, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    proc = export_cli("--adapter", exported.adapter, "--out", mine)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "notes.txt" in lines[0] and "--move-aside" in lines[0]
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_without_tokenizer_files_the_base_tokenizer_is_used(exported, tmp_path):
    from agentic_rag.export import export_tokenizer
    from agentic_rag.models import load_tokenizer

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "adapter_config.json").write_text((exported.adapter / "adapter_config.json").read_text())
    tok, source = export_tokenizer(bare, SMOL)
    assert tok.chat_template == load_tokenizer(SMOL).chat_template and "base model" in source
    (bare / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    tok, source = export_tokenizer(bare, SMOL)
    assert tok.chat_template == "{{ messages[0]['content'] }}" and "chat_template.jinja" in source
