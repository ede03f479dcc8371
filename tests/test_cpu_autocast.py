"""``model.cpu_autocast`` / ``agentic-rag sft --cpu-autocast``: a CPU run's forward and backward passes in bf16.

The setting resolves against the CPU's flags (native bf16: AVX512-BF16 or AMX-BF16), reaches TRL's ``bf16`` on a
CPU run, and a real SFT step under it trains the fp32 adapter from bf16 matrix products."""

from __future__ import annotations

import json

import pytest

from agentic_rag.training.machine import cpu_bf16, cpu_has_native_bf16

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    assert not cpu_has_native_bf16(AVX2) and not cpu_has_native_bf16("")
    assert cpu_has_native_bf16(AVX512_BF16) and cpu_has_native_bf16(AMX)
    assert cpu_bf16("bf16") and not cpu_bf16("none")
    assert cpu_bf16("auto") == cpu_has_native_bf16()
    with pytest.raises(ValueError, match="bfloat16"):  # a typo is refused, not trained in fp32
        cpu_bf16("bfloat16")


@pytest.mark.parametrize("setting", ["none", "bf16"])
def test_the_setting_reaches_a_cpu_runs_trainer(setting):
    from agentic_rag.training.config import config_from_dict
    from agentic_rag.training.train import grpo_args

    cfg = config_from_dict({"model": {"name_or_path": "x", "cpu_autocast": setting}, "data": {"train_file": "q"},
                            "search": {"index": "i"}}, env={}, check_files=False)
    assert grpo_args(cfg, use_cpu=True).bf16 is (setting == "bf16")
    # fp32 unless asked: the same numbers on every CPU
    default = config_from_dict({"model": {"name_or_path": "x"}, "data": {"train_file": "q"},
                                "search": {"index": "i"}}, env={}, check_files=False)
    assert default.model.cpu_autocast == "none"


def test_sft_under_bf16_autocast_trains_the_fp32_adapter(tmp_path, tiny_model_dir, world_dir, qwen_tokenizer):
    import torch

    from agentic_rag.training.sft import build_sft_trainer
    from test_launch import sft_file

    data, _, _ = sft_file(tmp_path, qwen_tokenizer, world_dir)
    trainer, _, _ = build_sft_trainer(model=str(tiny_model_dir), data=str(data), output_dir=str(tmp_path / "sft"),
                                      batch_size=4, lora_r=4, lora_alpha=8, learning_rate=5e-3, cpu_autocast="bf16")
    assert trainer.args.bf16 and trainer.accelerator.mixed_precision == "bf16"
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert lora and all(p.dtype == torch.float32 for p in lora.values())
    seen = []
    layer = next(m for n, m in trainer.model.named_modules() if n.endswith("q_proj.base_layer"))
    handle = layer.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    result = trainer.train()
    handle.remove()
    assert torch.bfloat16 in seen and json.dumps(result.training_loss) != "NaN"
    changed = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, lora[n])]
    assert changed and all(p.dtype == torch.float32 for p in trainer.model.parameters() if p.requires_grad)


@pytest.mark.parametrize("setting", ["none", "bf16"])
def test_grpo_under_cpu_bf16_trains_inside_a_heap_stretch(tmp_path, monkeypatch, tiny_model_dir, world_dir, setting):
    """Under CPU bf16 autocast the 1 MiB mmap threshold maps every weight copy anew (agentic_rag.malloc): a GRPO run
    trains inside heap_for_blocks_below, and only then."""
    from contextlib import contextmanager

    from agentic_rag import malloc
    from agentic_rag.training.config import config_from_dict
    from agentic_rag.training.train import run

    entered = []
    real = malloc.heap_for_blocks_below

    @contextmanager
    def recorded(*a, **k):
        with real(*a, **k) as changed:
            entered.append(changed)
            yield changed
    monkeypatch.setattr(malloc, "heap_for_blocks_below", recorded)
    cfg = config_from_dict({
        "model": {"name_or_path": str(tiny_model_dir), "gradient_checkpointing": False, "lora_r": 4,
                  "cpu_autocast": setting},
        "data": {"train_file": str(world_dir / "world" / "train.jsonl"), "limit": 4},
        "search": {"index": str(world_dir / "index")},
        "rollout": {"max_turns": 2, "max_tokens_per_turn": 12, "max_completion_tokens": 96, "passages_per_search": 1,
                    "max_observation_tokens": 48},
        "algorithm": {"num_generations": 2, "per_device_train_batch_size": 4, "max_steps": 1},
        "logging": {"swanlab_mode": "disabled"}, "checkpoint": {"output_dir": str(tmp_path / "run")}}, env={})
    assert run(cfg)["global_step"] == 1
    assert len(entered) == (setting == "bf16")
