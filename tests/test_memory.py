"""The memory estimator: exact parameter counts of real configs, the quantisation bytes of real bitsandbytes
tensors, the CLI's JSON, offline errors, the fit warning, and the estimate against a measured CPU training step."""

from __future__ import annotations

import configparser
import fnmatch
import json
import math
import sys
from dataclasses import replace

import pytest

from agentic_rag.cli import main
from agentic_rag.training import memory, model_arch
from agentic_rag.training.memory import GiB, TrainingSetup, estimate
from agentic_rag.training.memory_advice import EstimateInputs, check_fits
from agentic_rag.training.model_arch import builtin_models, load_arch
from conftest import ROOT

# Published parameter totals of the real checkpoints (the model cards' safetensors totals).
GOLDEN_PARAMETERS = {
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-14b": 14_770_033_664,
    "qwen2.5-32b": 32_763_876_352,
    "qwen2.5-72b": 72_706_203_648,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.2-1b": 1_235_814_400,
}

REFERENCE = TrainingSetup(lora_rank=64, batch=1, num_generations=8, micro_batch=4, max_prompt=1024,
                          max_completion=2048, gradient_checkpointing=True)


def total(model: str, setup: TrainingSetup) -> float:
    return estimate(model, setup).total / GiB


# -------------------------------------------------------------------------------------------- parameter counts


@pytest.mark.parametrize("name", sorted(GOLDEN_PARAMETERS))
def test_builtin_config_has_the_real_parameter_count(name):
    arch = load_arch(name)
    assert arch.total_params == GOLDEN_PARAMETERS[name]
    untied = 0 if arch.tie_word_embeddings else arch.vocab_size * arch.hidden_size
    assert arch.embedding_params == arch.vocab_size * arch.hidden_size and arch.lm_head_params == untied
    # every parameter is an embedding, the LM head, a linear weight or a small one (norms, biases)
    assert (arch.embedding_params + arch.lm_head_params + arch.linear_weight_params + arch.small_params
            == arch.total_params)
    assert {g.name for g in arch.linears} == set(memory.DEFAULT_LORA_TARGETS)
    assert all(g.count == arch.num_layers for g in arch.linears)


def test_builtin_configs_are_listed_and_reachable_by_hub_id():
    models = builtin_models()
    assert set(models) == set(GOLDEN_PARAMETERS)
    assert models["qwen2.5-32b"] == "Qwen/Qwen2.5-32B-Instruct"
    assert load_arch("Qwen/Qwen2.5-32B-Instruct").total_params == GOLDEN_PARAMETERS["qwen2.5-32b"]


def test_lora_parameter_count_matches_peft_on_the_real_7b_shapes():
    # PEFT reports 161,480,704 trainable parameters for r=64 on all linear layers of Qwen2.5-7B.
    assert load_arch("qwen2.5-7b").lora_params(64, memory.DEFAULT_LORA_TARGETS) == 161_480_704
    assert estimate("qwen2.5-7b", replace(REFERENCE, lora_rank=64)).trainable_params == 161_480_704


def test_model_dir_and_config_json_are_read(tmp_path):
    data = json.loads((ROOT / "src/agentic_rag/resources/model_configs/qwen2.5-7b.json").read_text())
    data.pop("_hub_id")
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert load_arch(str(tmp_path)).total_params == GOLDEN_PARAMETERS["qwen2.5-7b"]
    assert load_arch(str(tmp_path / "config.json")).total_params == GOLDEN_PARAMETERS["qwen2.5-7b"]


def test_model_configs_ship_with_the_package():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    patterns = [p.strip() for p in cfg["options.package_data"]["agentic_rag"].split(",")]
    pkg = ROOT / "src" / "agentic_rag"
    files = sorted((pkg / "resources" / "model_configs").glob("*.json"))
    assert len(files) == len(GOLDEN_PARAMETERS)
    for f in files:
        rel = f.relative_to(pkg).as_posix()
        # setuptools matches package_data globs per path segment: "resources/*" does not reach a subfolder
        assert any(fnmatch.fnmatch(rel, p) and p.count("/") == rel.count("/") for p in patterns), rel


# ------------------------------------------------------------------------------------------------ quantisation


def test_nf4_bytes_match_real_bitsandbytes_tensors():
    torch = pytest.importorskip("torch")
    bnbf = pytest.importorskip("bitsandbytes.functional")
    w = torch.randn(1024, 896, dtype=torch.bfloat16)
    try:
        packed, state = bnbf.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4",
                                           quant_storage=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as exc:  # no CPU kernel in this bitsandbytes build
        pytest.skip(f"bitsandbytes cannot quantise on the CPU here: {exc}")

    def nbytes(t):
        return t.numel() * t.element_size()

    blocks = math.ceil(w.numel() / model_arch.NF4_BLOCK)
    assert nbytes(packed) == w.numel() // 2
    assert nbytes(state.absmax) == blocks  # uint8 absmax under double quantisation
    assert nbytes(state.state2.absmax) == 4 * math.ceil(blocks / model_arch.DOUBLE_QUANT_BLOCK)
    # the estimator's per-weight constants: 1 byte per block + 4 per second-level block + the fp32 offset
    consts = blocks + 4 * math.ceil(blocks / model_arch.DOUBLE_QUANT_BLOCK) + 4
    assert consts == nbytes(state.absmax) + nbytes(state.state2.absmax) + 4 * state.offset.numel()


def test_nf4_weights_are_about_a_quarter_of_bf16():
    arch = load_arch("qwen2.5-32b")
    bf16 = estimate(arch, replace(REFERENCE, quant="none")).terms["weights"]
    nf4 = estimate(arch, replace(REFERENCE, quant="nf4")).terms
    # linear weights at 0.5 byte, constants 1 byte per 64 + 4 bytes per 64 * 256; embeddings and LM head stay bf16
    consts_per_param = (1 + 4 / 256) / 64
    expected = arch.linear_weight_params * (0.5 + consts_per_param) + 2 * arch.dense_params
    assert nf4["weights"] == pytest.approx(expected, rel=1e-4)
    assert nf4["quant_constants"] == pytest.approx(arch.linear_weight_params * consts_per_param, rel=1e-4)
    assert 0.28 < nf4["weights"] / bf16 < 0.32


def test_fused_head_constants_mirror_trl():
    from trl.kernels import chunked_logprob
    from trl.trainer import utils as trl_utils

    assert memory.FUSED_HEAD_TOKEN_TILE == chunked_logprob.TOKEN_CHUNK_SIZE
    assert memory.FUSED_HEAD_VOCAB_TILE == trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE


# ---------------------------------------------------------------------------------------------- monotonicity


@pytest.mark.parametrize("model", ["qwen2.5-7b", "qwen2.5-32b", "llama-3.1-8b"])
def test_more_gpus_zero3_and_nf4_reduce_per_gpu_memory(model):
    for quant in ("none", "nf4"):
        for zero in (2, 3):
            one, two, four = (total(model, replace(REFERENCE, quant=quant, zero=zero, gpus=n)) for n in (1, 2, 4))
            assert one > two > four, (quant, zero)
    for n in (2, 4):
        assert total(model, replace(REFERENCE, gpus=n, zero=3)) < total(model, replace(REFERENCE, gpus=n, zero=2))
    for zero in (2, 3):
        none, int8, nf4 = (total(model, replace(REFERENCE, gpus=2, zero=zero, quant=q))
                           for q in ("none", "int8", "nf4"))
        assert none > int8 > nf4


def test_workload_terms_grow_with_the_workload():
    base = estimate("qwen2.5-7b", REFERENCE)
    longer = estimate("qwen2.5-7b", replace(REFERENCE, max_completion=4096))
    more = estimate("qwen2.5-7b", replace(REFERENCE, num_generations=16))
    no_gc = estimate("qwen2.5-7b", replace(REFERENCE, gradient_checkpointing=False))
    assert longer.terms["kv_cache"] == pytest.approx(base.terms["kv_cache"] * (1024 + 4096) / (1024 + 2048))
    assert more.terms["kv_cache"] == pytest.approx(2 * base.terms["kv_cache"])
    assert more.terms["activations"] == base.terms["activations"]  # the micro-batch did not change
    assert no_gc.terms["activations"] > 3 * base.terms["activations"]
    assert longer.total > base.total and no_gc.total > base.total
    assert more.phases["generation"] > base.phases["generation"] and more.total >= base.total
    # KV cache of Qwen2.5-7B: 28 layers x 2 x 4 KV heads x 128 x 2 bytes = 57,344 bytes per token
    assert base.terms["kv_cache"] == 57_344 * 8 * (1024 + 2048)


def test_the_fused_head_removes_the_large_vocabulary_term():
    fused = estimate("qwen2.5-32b", replace(REFERENCE, gpus=2, zero=3))
    full = estimate("qwen2.5-32b", replace(REFERENCE, gpus=2, zero=3, logits="full"))
    assert full.terms["logits"] > 10 * fused.terms["logits"]
    assert full.terms["logits"] > 4 * micro_completion_vocab_bytes(fused)


def micro_completion_vocab_bytes(est) -> float:
    return est.setup.completions_per_step * est.setup.max_completion * est.arch.vocab_size


def test_zero3_gather_for_generation_puts_the_whole_model_on_each_gpu():
    setup = replace(REFERENCE, gpus=2, zero=3)
    est = estimate("qwen2.5-32b", setup)
    full_weights = estimate("qwen2.5-32b", replace(setup, gpus=1)).terms["weights"]
    resident = est.terms["weights"] + est.terms["lora"]
    assert est.terms["zero3_gather_generation"] + resident == pytest.approx(
        full_weights + est.trainable_params * 2, rel=1e-6)
    layered = estimate("qwen2.5-32b", replace(setup, ds3_gather_for_generation=False))
    assert layered.phases["generation"] < est.phases["generation"]
    # ... but no suggestion turns gathering off: the rollout would hang without it, and the config check refuses it
    from agentic_rag.training.memory_advice import _alternatives

    assert all(alt.ds3_gather_for_generation for _, alt in _alternatives(setup))


def test_setup_problems_are_reported_together():
    with pytest.raises(ValueError) as err:
        TrainingSetup(gpus=0, zero=1, quant="fp8", micro_batch=3)
    msg = str(err.value)
    assert "gpus must be >= 1" in msg and "zero must be one of" in msg and "quant must be one of" in msg
    assert "micro-batch (3) must divide" in msg
    with pytest.raises(ValueError, match="match no linear layer"):
        estimate("qwen2.5-7b", replace(REFERENCE, lora_targets=("c_attn",)))


# ------------------------------------------------------------------------------------------------------- CLI


def test_cli_json_schema(capsys):
    assert main(["estimate-memory", "--model", "qwen2.5-32b", "--gpus", "2", "--zero", "3", "--quant", "nf4",
                 "--lora-rank", "64", "--batch", "1", "--num-generations", "8", "--max-prompt", "1024",
                 "--max-completion", "2048", "--micro-batch", "4", "--gradient-checkpointing", "--json",
                 "--gpu-memory", "80"]) == 0
    out = json.loads(capsys.readouterr().out)
    required = {"weights_gb", "lora_gb", "gradients_gb", "optimizer_gb", "activations_gb", "kv_cache_gb", "logits_gb"}
    assert required <= set(out["breakdown"])
    assert all(isinstance(v, float) and v >= 0 for v in out["breakdown"].values())
    assert out["parameters"] == GOLDEN_PARAMETERS["qwen2.5-32b"]
    assert out["per_gpu_total_gb"] == pytest.approx(out["allocated_gb"] + out["overhead_gb"], abs=0.002)
    assert out["allocated_gb"] == max(out["phases_gb"].values())
    assert out["per_gpu_total_gb"] > out["breakdown"]["weights_gb"] + out["breakdown"]["optimizer_gb"]
    assert out["setup"]["zero"] == 3 and out["setup"]["micro_batch"] == 4
    assert out["fits"] is True and out["warning"] is None


def test_cli_table(capsys):
    assert main(["estimate-memory", "--model", "llama-3.1-8b", "--quant", "none", "--gpu-memory", "24"]) == 0
    out = capsys.readouterr().out
    assert "rollout KV cache" in out and "GiB per GPU" in out and "memory estimate:" in out


def test_cli_hub_name_offline_fails_with_a_clear_message(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["estimate-memory", "--model", "meta-llama/Llama-3.3-70B-Instruct"]) == 2
    err = capsys.readouterr().err
    assert "meta-llama/Llama-3.3-70B-Instruct" in err and "Hugging Face hub" in err
    assert "qwen2.5-32b" in err  # names the built-in configs that work offline


def test_cli_rejects_bad_arguments(capsys):
    assert main(["estimate-memory", "--model", "qwen2.5-7b", "--micro-batch", "3"]) == 2
    assert "micro-batch (3) must divide" in capsys.readouterr().err
    assert main(["estimate-memory", "--model", "no/such/path.json"]) == 2
    assert "neither an existing path" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- fit warning


def test_check_fits_is_silent_when_it_fits():
    assert check_fits(EstimateInputs("qwen2.5-7b", replace(REFERENCE, quant="nf4")), 80) is None


def test_check_fits_warns_with_the_budget_and_what_to_change():
    setup = replace(REFERENCE, quant="none", zero=2, gpus=1, gradient_checkpointing=False)
    msg = check_fits(EstimateInputs("qwen2.5-32b", setup), 80)
    assert msg is not None
    est = estimate("qwen2.5-32b", setup).total / GiB
    assert f"~{est:.1f} GiB per GPU" in msg and "80.0 GiB" in msg and "activations" in msg
    # each suggestion carries its own estimate
    for label, alt in [("nf4 (QLoRA)", replace(setup, quant="nf4")),
                       ("2 GPUs with ZeRO-3", replace(setup, gpus=2, zero=3)),
                       ("gradient checkpointing", replace(setup, gradient_checkpointing=True)),
                       ("micro-batch 2 instead of 4", replace(setup, micro_batch=2))]:
        assert f"{label}" in msg and f"{estimate('qwen2.5-32b', alt).total / GiB:.1f} (" in msg, label
    # no single change is enough without gradient checkpointing; all of them together fit
    assert msg.splitlines()[-1].startswith("  - all together") and msg.endswith("(fits)")
    assert msg.count("(fits)") == 1


# --------------------------------------------------------------------------------------- CPU measurement


def test_estimate_matches_a_measured_cpu_training_step():
    """A fresh process trains a 2-layer Qwen2.5-0.5B (real widths and vocabulary, random init) with LoRA and TRL's
    fused LM head; weights, LoRA, AdamW state, the step's transient memory and the peak are within 15%."""
    sys.path.insert(0, str(ROOT / "experiments" / "benchmarks"))
    import memory_check

    args = memory_check.parser().parse_args(["--model", "qwen2.5-0.5b", "--layers", "2", "--micro-batch", "2",
                                             "--prompt", "48", "--completion", "48", "--lora-rank", "128"])
    result = memory_check.check(args)
    assert result["parameters"] == result["estimated_parameters"]
    assert result["trainable_parameters"] == result["estimated_trainable_parameters"]
    for name, term in result["terms"].items():
        assert abs(term["error"]) <= memory_check.TARGET_ERROR, (name, term)
    assert result["terms"]["weights"]["measured_mib"] > 500  # the measurement saw the fp32 weights


# ------------------------------------------------------------------------------ the trainer's pre-load check


def test_fit_warning_is_logged_before_the_model_loads(tmp_path, tiny_model_dir, world_dir, monkeypatch):
    import logging

    from agentic_rag.training import model as model_module
    from agentic_rag.training.config import load_config
    from agentic_rag.training.train import run
    from test_launch import config

    events: list[tuple[str, str]] = []

    class Record(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                events.append(("warning", record.getMessage()))

    class Loaded(Exception):
        pass

    def load(cfg, **kw):
        events.append(("load", cfg.name_or_path))
        raise Loaded

    monkeypatch.setattr(model_module, "load_base_model", load)
    handler = Record()
    logger = logging.getLogger("agentic_rag.train")
    logger.addHandler(handler)
    try:
        with pytest.raises(Loaded):  # a tiny GPU: the estimate must warn, and before the (long) model load
            run(load_config(config(tmp_path, tiny_model_dir, world_dir, gpu_memory_gb=0.001)))
    finally:
        logger.removeHandler(handler)
    assert [kind for kind, _ in events] == ["warning", "load"]
    assert "memory estimate" in events[0][1] and "0.0 GiB" in events[0][1]


def test_the_estimate_uses_the_launch_stage_and_the_runs_real_lengths(tmp_path, tiny_model_dir, world_dir,
                                                                      monkeypatch, qwen_tokenizer):
    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.data.questions import read_questions
    from agentic_rag.training.config import load_config
    from agentic_rag.training.train import fit_check, memory_setup
    from test_launch import config

    cfg = load_config(config(tmp_path, tiny_model_dir, world_dir, gpu_memory_gb=0.001,
                             model__lora_target_modules=["q_proj", "v_proj"], model__lora_dropout=0.1))
    # what accelerate sets in each process of a 2-process launch by train_zero3.sh
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    setup, warning = fit_check(cfg)
    assert setup.zero == 3 and setup.gpus == 2
    assert "2 process(es) with DeepSpeed ZeRO-3" in warning
    # the real prompt length (the longest templated training prompt), LoRA targets and dropout
    questions = read_questions(cfg.data.train_file, limit=cfg.data.limit)
    longest = max(len(build_prompt(qwen_tokenizer, q.question)) for q in questions)
    assert setup.max_prompt == longest and longest != 512
    assert setup.lora_targets == ("q_proj", "v_proj") and setup.lora_dropout == 0.1 and setup.lora_rank == 4
    assert setup.max_completion == cfg.rollout.max_completion_tokens
    assert setup.micro_batch == 2 and setup.rollout_sequences == 2  # 2 completions per GPU per round
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert memory_setup(cfg).zero == 2


def test_the_zero3_script_tells_the_trainer_its_stage(tmp_path):
    """train_zero3.sh exports the stage the estimate reads (its accelerate config names only a DeepSpeed file)."""
    import os
    import subprocess

    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "stage=$ACCELERATE_DEEPSPEED_ZERO_STAGE args=$*"\n')
    fake.chmod(0o755)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("{}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(AGENTIC_RAG_NO_VENV="1", PYTHON=str(fake), USE_CPU="1", ENV_FILE="/dev/null")
    for stage in (2, 3):
        out = subprocess.run(["bash", str(ROOT / "script" / "training" / f"train_zero{stage}.sh"), str(cfg)],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        assert f"stage={stage} " in out.stdout
        assert f"experiments/training/accelerate/zero{stage}_cpu.yaml" in out.stdout
        ds = (ROOT / "experiments" / "training" / "accelerate" / f"zero{stage}_cpu.yaml").read_text()
        assert f"deepspeed/zero{stage}.json" in ds
        assert json.loads((ROOT / "experiments" / "training" / "deepspeed" / f"zero{stage}.json").read_text())[
            "zero_optimization"]["stage"] == stage


def test_a_cpu_run_that_cannot_fit_the_ram_is_refused_before_the_model_loads(tmp_path, tiny_model_dir, world_dir,
                                                                             monkeypatch, capsys):
    """On the CPU the trainer asks the estimator whether one training step fits the RAM available and refuses
    the config when it does not, naming what would help, instead of letting the kernel kill the run part-way."""
    from agentic_rag.training import train
    from test_launch import config

    path = config(tmp_path, tiny_model_dir, world_dir)

    def no_model(cfg):
        raise AssertionError("the model must not load for a config that cannot fit")

    monkeypatch.setattr(train, "policy_model", no_model)
    monkeypatch.setenv("AGENTIC_RAG_RAM_GB", "0.05")
    assert train.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "memory estimate: training" in err and "0.1 GiB is available" in err, err
    assert "model.gradient_checkpointing: true" in err and "AGENTIC_RAG_RAM_GB" in err
    # the same config with room: no refusal
    from agentic_rag.training.config import load_config

    monkeypatch.setenv("AGENTIC_RAG_RAM_GB", "64")
    assert train.ram_check(load_config(path)) is None


def test_the_ram_estimate_grows_with_the_micro_batch_and_checkpointing_shrinks_it(tiny_model_dir):
    from dataclasses import replace

    from agentic_rag.training.memory import TrainingSetup, estimate
    from agentic_rag.training.memory_advice import CPU_PROCESS_GB, EstimateInputs, check_fits_ram

    setup = TrainingSetup(device="cpu", batch=4, num_generations=4, micro_batch=8, max_prompt=64, max_completion=200,
                          lora_rank=4, lora_dropout=0.0, lora_targets=("q_proj", "v_proj"))
    need = {mb: estimate(str(tiny_model_dir), replace(setup, micro_batch=mb)).total / 2**30 + CPU_PROCESS_GB
            for mb in (2, 8)}
    assert need[2] < need[8]
    assert check_fits_ram(EstimateInputs(str(tiny_model_dir), setup), need[8] + 0.01) is None
    refusal = check_fits_ram(EstimateInputs(str(tiny_model_dir), setup), (need[2] + need[8]) / 2)
    assert refusal and "per_device_train_batch_size: 4" in refusal and "(fits)" in refusal


def test_a_runs_peak_memory_is_its_own_not_its_parents():
    """The quick start starts each training run from a parent holding its evaluation models. Linux carries
    ru_maxrss across fork and exec, so the old measure reported the parent's size for every run (two different
    runs showed the same 5,067.75 MB); the high-water mark of the run's own address space does not."""
    import subprocess
    import sys

    big = bytearray(400 * 2**20)
    for i in range(0, len(big), 4096):  # touched, so resident
        big[i] = 1
    code = ("import resource; from agentic_rag.training.train import peak_rss_mb; "
            "print(peak_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    own, inherited = float(out[0]), float(out[1])
    assert inherited > 400, "the premise: ru_maxrss counts the parent"
    assert own < 300, f"peak_rss_mb reported {own:.0f} MB for a child that holds far less"
    del big
