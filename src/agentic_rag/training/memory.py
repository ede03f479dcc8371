"""Per-GPU peak memory of a LoRA/QLoRA GRPO run, estimated from the model's real config before loading it.

Why: the product promises that QLoRA + DeepSpeed trains a 32B model with search on two A100s. Users need to know
what fits before a 30-minute model load dies with an out-of-memory error, and the trainer warns when the estimate
says it will not fit (:func:`~agentic_rag.training.memory_advice.check_fits`).

This module holds the estimate itself: the training setup (:class:`TrainingSetup`), the byte terms and phases
(:func:`estimate`, :class:`MemoryEstimate`). The model's shape comes from :mod:`.model_arch` (read from its config,
no weights); the fit verdicts and the advice on what to change are in :mod:`.memory_advice`; the probes of the
machine's GPU and RAM in :mod:`.machine`.

What is modelled (the training setup of this project; every number below is per GPU):

* **Model** (:class:`~agentic_rag.training.model_arch.ModelArch`): the config is instantiated on the ``meta``
  device (no weights, no download) and its parameters are counted module by module: the input embedding, the LM
  head (0 when tied), every ``nn.Linear`` (the layers bitsandbytes quantises and LoRA targets; the LM head is never
  quantised) and the rest (norms, biases).
* **Base weights** (``weights``). ``quant=none``: bf16, 2 bytes/parameter. ``nf4`` (bitsandbytes 4-bit, quant
  storage bf16 so ZeRO-3 can shard the packed weights): 0.5 byte/parameter of every linear weight, plus the
  quantisation constants: one absmax per 64-element block, fp32 (4 bytes) without double quantisation; with double
  quantisation 1 byte per block plus, per weight, one fp32 absmax per 256 blocks and one fp32 offset. ``int8``
  (LLM.int8): 1 byte/parameter plus one fp32 scale per output row. Embeddings, LM head, norms and biases stay bf16.
  ZeRO-2 keeps the full weights on every GPU; ZeRO-3 shards parameters over the GPUs, except those under its
  persistence threshold (10 * hidden_size elements: norms, biases); the quantisation constants are not parameters
  and stay replicated. int8 is modelled by its storage only.
* **LoRA** (``lora``): rank r on the target linear layers, r * (in + out) parameters each, bf16 on the GPU (TRL
  casts QLoRA adapters to bf16; DeepSpeed's bf16 mode casts the module). Sharded under ZeRO-3 only.
* **Optimizer** (``optimizer``): AdamW through DeepSpeed: an fp32 master copy plus the two fp32 moments of every
  trainable parameter, 12 bytes/parameter, sharded over the GPUs under ZeRO-2 and ZeRO-3.
* **Gradients** (``gradients``): the bf16 gradient partition of the trainable parameters (2 bytes/parameter / N)
  plus one reduce bucket of ``hidden_size**2`` elements (the value the HF DeepSpeed integration's ``auto``
  picks). At the optimizer step DeepSpeed also holds an fp32 copy of the gradient partition (4 bytes/parameter / N).
* **Rollout KV cache** (``kv_cache``): HF ``generate`` keeps keys and values of every layer for all
  ``batch * num_generations`` sequences of the GPU's generation batch (or ``generation_batch`` of them when the
  rollout decodes in smaller batches), ``max_prompt + max_completion`` tokens each:
  sequences * tokens * layers * 2 * kv_heads * head_dim * 2 bytes. ``max_completion`` is the whole rollout budget,
  inserted search results included.
* **Generation workspace**: the prefill of all sequences' prompts at once (per prompt token the MLP's four
  intermediate-sized temporaries and the attention's ~7 hidden-sized ones, bf16), or, at the end of decoding, the
  next-token scores (bf16 logits, fp32 scores, fp32 probabilities over the vocabulary) plus one layer's cache being
  re-concatenated. The generation phase is the larger of the two moments (prefill with the prompt's cache, end of
  decoding with the full cache).
* **Activations** (``activations``), for one micro-batch of ``micro_batch`` completions of ``max_prompt +
  max_completion`` tokens (T tokens in all), counting what autograd saves for backward per token and per decoder
  layer, with e bytes per element (2 in bf16 on the GPU, 4 in fp32 on the CPU):

  - each RMSNorm keeps its fp32 input (4h), twice per layer;
  - a normed hidden state (e*h) when a LoRA layer reads it (q/k/v, gate/up): LoRA's A matrix saves its input;
  - RoPE'd queries (e*a*d) and keys plus values as saved by SDPA: with padding in the batch transformers passes a
    mask, SDPA cannot use GQA, and keys and values are repeated to all heads (e*a*d each; e*g*d without padding);
  - the SDPA output (e*a*d), its contiguous copy read by o_proj's LoRA (e*a*d, when o_proj is a target);
  - the MLP: SiLU's input, SiLU's output and up_proj's output (saved by the product), the product (read by
    down_proj's LoRA): 3 or 4 times e*intermediate;
  - with LoRA dropout > 0, each target keeps its dropped input (e*in) and the dropout mask (1 byte * in).

  Without gradient checkpointing every layer's tensors are kept (layers * per-layer bytes * T). With it, only
  each layer's input (e*h*T per layer) plus one recomputed layer at a time. Both add the padding mask (one byte
  per query-key pair) and the backward workspace of one layer (e*(4*intermediate + 4*hidden) per token: the
  gradients flowing through the MLP). The final norm's fp32 input (4h*T) is kept as well.
* **Loss logits** (``logits``). TRL 1.16's GRPOTrainer never materialises the ``(batch, tokens, vocab)`` logits: it
  patches the model with a fused LM head (``trl.trainer.utils.add_fused_lm_head``) that projects the scored
  positions in tiles of at most 4096 tokens x 32768 vocabulary entries, folding each tile into an online
  log-sum-exp, and recomputes the tiles in backward. Its memory: the scored hidden states it saves (e*h per
  scored position), the fp32 gradient of those hidden states (4h), one tile buffer in the compute dtype, and a few
  fp32 values per position. On CUDA (Triton) only the completion positions are scored and the tile is folded in
  place; on the CPU every position is scored and the torch fallback keeps seven fp32 copies of the tile and a
  boolean one during backward. These are TRL's own rules and what ``experiments/benchmarks/memory_check.py``
  measures; ``AgenticGRPOTrainer`` scores less (environment tokens get label -100 and are not projected, and it
  makes the CPU score only labelled positions as Triton does), so for it the term is an upper bound: it counts
  every completion position, inserted observations included. ``--logits full`` models a trainer that
  materialises the completion logits instead: bf16 logits, their fp32 log-softmax kept for backward and an fp32
  gradient, 10 bytes per (completion token, vocabulary entry).
* **ZeRO-3 gathers** (``zero3_gather``): ZeRO-3 gathers each module's full parameters when it runs: in training, at
  most the larger of the embedding, the LM head or two decoder layers plus the prefetch bucket
  (0.9 * hidden_size**2 elements, HF's ``auto``). For generation TRL gathers the whole model at once
  (``ds3_gather_for_generation=True``, its default), which puts the full weights on every GPU for the rollout.
* **Dequantisation workspace**: a 4-bit or 8-bit linear layer is dequantised to bf16 for the matmul, one layer
  at a time (the largest linear layer, bf16).

Phases. Terms that never coexist are not added: the peak is the largest of

* generation: weights + LoRA + optimizer + ZeRO-3 generation gather + dequant + max(prefill moment, end of decoding);
* training: weights + LoRA + optimizer + ZeRO-3 training gather + dequant + the larger of the LM-head backward
  moment (kept activations without the recomputed layer + logits, + the gradient partition on the GPU, where it
  persists across gradient-accumulation micro-steps) and the decoder backward moment (all activations +
  gradients);
* optimizer step: weights + LoRA + optimizer + gradients + the fp32 gradient partition.

That maximum is comparable to ``torch.cuda.max_memory_allocated``. What must fit on the GPU
(``per_gpu_total_gb``) adds the caching allocator's fragmentation (:data:`ALLOCATOR_FRAGMENTATION` of the
allocated peak), the CUDA context (:data:`CUDA_CONTEXT_GB`) and, with more than one GPU, NCCL's buffers
(:data:`NCCL_BUFFERS_GB`). The reference policy is the base model with the adapter disabled (no second copy); with
TRL's default ``beta=0`` it is not even run, and with ``beta > 0`` it (like the old-policy log-probs) runs without
gradients on one micro-batch at a time after the rollout, which needs less than the training step.

Batch convention: ``batch`` is the number of prompts per GPU per generation round, each sampled
``num_generations`` times, so the GPU rolls out ``batch * num_generations`` sequences at once (TRL's
``per_device_train_batch_size * steps_per_generation``). ``micro_batch`` is the number of completions in one
forward/backward (TRL's ``per_device_train_batch_size``, which counts completions); it defaults to all of them.

``device="cpu"`` models a plain PyTorch step in fp32 (no DeepSpeed, no quantisation): fp32 weights, LoRA and
gradients, AdamW's two fp32 moments and no master copy, no CUDA overheads. It exists to check the estimator
against measured process memory (``experiments/benchmarks/memory_check.py``).

All sizes are in GiB (2**30 bytes), the unit ``torch.cuda`` and ``nvidia-smi`` report; a "80 GB" A100 has 80 GiB.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .model_arch import ModelArch, load_arch

GiB = 2**30

# Overheads outside the allocated peak (named so they can be argued about and changed in one place).
CUDA_CONTEXT_GB = 0.6  # CUDA context + cuBLAS/cuDNN workspaces: not in max_memory_allocated, but on the GPU
NCCL_BUFFERS_GB = 0.5  # NCCL communicator buffers per GPU when more than one GPU takes part
ALLOCATOR_FRAGMENTATION = 0.10  # reserved-but-unallocated share of PyTorch's caching allocator at the peak

# TRL 1.16's fused LM head tiles: trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE tokens by
# trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE vocabulary entries.
FUSED_HEAD_TOKEN_TILE = 4096
FUSED_HEAD_VOCAB_TILE = 32768
# fp32 copies of a tile the torch fallback (CPU) keeps alive in the fused head's backward, plus one boolean copy.
FUSED_HEAD_CPU_FP32_TILES = 7
# fp32 values per scored position kept by the fused head (running max, sums, target logit, log-partition, ...).
FUSED_HEAD_FP32_PER_TOKEN = 9
# bytes per (completion token, vocabulary entry) of a trainer that materialises the logits (``logits="full"``).
FULL_LOGITS_BYTES_PER_ELEMENT = 10

# DeepSpeed's stage3_prefetch_bucket_size as the HF integration's "auto" fills it.
ZERO3_PREFETCH_FRACTION = 0.9  # stage3_prefetch_bucket_size = 0.9 * hidden_size**2 elements

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANT_CHOICES = ("none", "nf4", "int8")
ZERO_CHOICES = (2, 3)
LOGITS_CHOICES = ("fused", "full")
DEVICE_CHOICES = ("cuda", "cpu")


# ---------------------------------------------------------------------------------------------- training setup


@dataclass(frozen=True)
class TrainingSetup:
    """How the model is trained; every field has the meaning of the ``estimate-memory`` option of the same name.

    The defaults follow the training config (``agentic_rag.training.config``): bf16 LoRA r=16 with dropout 0.05
    on every linear layer, 4 generations per prompt, 1024 completion tokens; gradient checkpointing is opt-in
    here (``--gradient-checkpointing``) although the trainer turns it on by default."""

    gpus: int = field(default=1, metadata={"help": "GPUs (DeepSpeed data-parallel ranks)"})
    zero: int = field(default=2, metadata={"help": "DeepSpeed ZeRO stage: 2 shards gradients and optimizer "
                                                   "states, 3 also the weights"})
    quant: str = field(default="none", metadata={"help": "base weights: none (bf16), nf4 (QLoRA), int8"})
    double_quant: bool = field(default=True, metadata={"help": "nf4: quantise the absmax constants too"})
    lora_rank: int = field(default=16, metadata={"help": "LoRA rank r"})
    lora_targets: tuple[str, ...] = field(default=DEFAULT_LORA_TARGETS, metadata={
        "help": "linear layers LoRA adapts (name suffixes), or 'all-linear' (every linear layer but the LM head)"})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout (> 0 keeps a dropped copy per target)"})
    batch: int = field(default=1, metadata={"help": "prompts per GPU per generation round"})
    num_generations: int = field(default=4, metadata={"help": "completions sampled per prompt (GRPO group size)"})
    micro_batch: int | None = field(default=None, metadata={
        "help": "completions per forward/backward (TRL per_device_train_batch_size); default batch*num_generations"})
    generation_batch: int | None = field(default=None, metadata={
        "help": "sequences decoded together (KV cache); default batch*num_generations, all of the rollout"})
    max_prompt: int = field(default=512, metadata={"help": "prompt tokens (padded length)"})
    max_completion: int = field(default=1024, metadata={
        "help": "completion tokens incl. inserted search results (padded length)"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute each layer in backward"})
    padded: bool = field(default=True, metadata={
        "help": "batches contain padding (an attention mask is passed; SDPA repeats GQA keys/values)"})
    ds3_gather_for_generation: bool = field(default=True, metadata={
        "help": "ZeRO-3: gather the whole model for the rollout (TRL's default)"})
    logits: str = field(default="fused", metadata={
        "help": "fused: TRL 1.16's chunked LM head; full: a trainer that materialises the logits"})
    device: str = field(default="cuda", metadata={"help": "cuda (DeepSpeed, bf16) or cpu (plain fp32 step)"})

    def __post_init__(self) -> None:
        problems = []
        for name in ("gpus", "lora_rank", "batch", "num_generations", "max_prompt", "max_completion"):
            if getattr(self, name) < 1:
                problems.append(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.zero not in ZERO_CHOICES:
            problems.append(f"zero must be one of {ZERO_CHOICES}, got {self.zero}")
        if self.quant not in QUANT_CHOICES:
            problems.append(f"quant must be one of {QUANT_CHOICES}, got {self.quant!r}")
        if self.logits not in LOGITS_CHOICES:
            problems.append(f"logits must be one of {LOGITS_CHOICES}, got {self.logits!r}")
        if self.device not in DEVICE_CHOICES:
            problems.append(f"device must be one of {DEVICE_CHOICES}, got {self.device!r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            problems.append(f"lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if not self.lora_targets:
            problems.append("lora-targets must name at least one linear layer")
        rollout = self.batch * self.num_generations
        if self.micro_batch is not None and (self.micro_batch < 1 or rollout % self.micro_batch):
            problems.append(f"micro-batch ({self.micro_batch}) must divide batch * num-generations ({rollout}): TRL "
                            "splits each GPU's generation batch into equal micro-batches")
        if self.generation_batch is not None and not 1 <= self.generation_batch <= rollout:
            problems.append(f"generation-batch ({self.generation_batch}) must be between 1 and batch * "
                            f"num-generations ({rollout})")
        if self.device == "cpu" and (self.gpus != 1 or self.quant != "none"):
            problems.append("device cpu models a plain fp32 step: use gpus 1 and quant none")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def rollout_sequences(self) -> int:
        return self.batch * self.num_generations

    @property
    def decoded_together(self) -> int:
        return self.generation_batch or self.rollout_sequences

    @property
    def completions_per_step(self) -> int:
        return self.micro_batch or self.rollout_sequences

    @property
    def seq_len(self) -> int:
        return self.max_prompt + self.max_completion


# -------------------------------------------------------------------------------------------------- estimate

TERM_LABELS = {
    "weights": "base weights",
    "quant_constants": "  of which quantisation constants",
    "lora": "LoRA weights",
    "optimizer": "optimizer states",
    "gradients": "gradients",
    "activations": "activations",
    "logits": "loss logits (LM head)",
    "kv_cache": "rollout KV cache",
    "generation_workspace": "generation workspace",
    "zero3_gather_generation": "ZeRO-3 gather (generation)",
    "zero3_gather_training": "ZeRO-3 gather (training)",
    "dequant_workspace": "dequantisation workspace",
    "optimizer_step_workspace": "optimizer step workspace",
}
TERM_PHASES = {
    "weights": "all", "quant_constants": "all", "lora": "all", "optimizer": "all",
    "gradients": "training, step", "activations": "training", "logits": "training",
    "kv_cache": "generation", "generation_workspace": "generation", "zero3_gather_generation": "generation",
    "zero3_gather_training": "training", "dequant_workspace": "generation, training",
    "optimizer_step_workspace": "step",
}


@dataclass
class MemoryEstimate:
    """Terms and phase totals in bytes per GPU. The terms are not additive (see the module docstring)."""

    arch: ModelArch
    setup: TrainingSetup
    trainable_params: int
    terms: dict[str, float]
    phases: dict[str, float]
    overhead: float

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.__getitem__)

    @property
    def allocated(self) -> float:
        """The peak of allocated tensor memory: comparable to ``torch.cuda.max_memory_allocated``."""
        return self.phases[self.peak_phase]

    @property
    def total(self) -> float:
        """What must fit on each GPU: the allocated peak plus fragmentation, CUDA context and NCCL buffers."""
        return self.allocated + self.overhead

    def breakdown_gb(self) -> dict[str, float]:
        return {f"{k}_gb": round(v / GiB, 4) for k, v in self.terms.items()}

    def to_dict(self) -> dict[str, Any]:
        setup = asdict(self.setup)
        setup["lora_targets"] = list(self.setup.lora_targets)
        setup["micro_batch"] = self.setup.completions_per_step
        setup["generation_batch"] = self.setup.decoded_together
        return {
            "model": self.arch.name,
            "parameters": self.arch.total_params,
            "trainable_parameters": self.trainable_params,
            "setup": setup,
            "per_gpu_total_gb": round(self.total / GiB, 4),
            "allocated_gb": round(self.allocated / GiB, 4),
            "overhead_gb": round(self.overhead / GiB, 4),
            "peak_phase": self.peak_phase,
            "phases_gb": {k: round(v / GiB, 4) for k, v in self.phases.items()},
            "breakdown": self.breakdown_gb(),
        }

    def format_table(self) -> str:
        s, a = self.setup, self.arch
        quant = {"none": "bf16", "nf4": "nf4" + (" + double quant" if s.double_quant else ""), "int8": "int8"}[s.quant]
        if s.device == "cpu":
            where = "1 CPU process, fp32, plain PyTorch AdamW"
        else:
            where = f"{s.gpus} GPU{'s' if s.gpus > 1 else ''}, DeepSpeed ZeRO-{s.zero}, base weights {quant}"
        lines = [
            f"model {a.name}: {a.total_params / 1e9:.2f} B parameters ({a.num_layers} layers, hidden {a.hidden_size},"
            f" vocab {a.vocab_size}); LoRA r={s.lora_rank} on {','.join(s.lora_targets)}: "
            f"{self.trainable_params / 1e6:.1f} M trainable",
            f"setup: {where}; rollout {s.batch} prompt(s) x {s.num_generations} generations = "
            f"{s.rollout_sequences} sequences of {s.max_prompt}+{s.max_completion} tokens, {s.decoded_together} "
            f"decoded together; micro-batch "
            f"{s.completions_per_step} completions; gradient checkpointing "
            f"{'on' if s.gradient_checkpointing else 'off'}; logits {s.logits}",
            "",
            f"{'term':<36} {'GiB/GPU':>9}  phase",
        ]
        for key, value in self.terms.items():
            if key == "quant_constants" and not value:
                continue
            lines.append(f"{TERM_LABELS.get(key, key):<36} {value / GiB:>9.2f}  {TERM_PHASES.get(key, '')}")
        lines.append("")
        lines.append("phase totals (allocated): " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in self.phases.items()))
        if s.device == "cpu":
            lines.append(f"peak: {self.allocated / GiB:.2f} GiB ({self.peak_phase})")
        else:
            lines.append(f"peak allocated {self.allocated / GiB:.2f} GiB ({self.peak_phase}) + overhead "
                         f"{self.overhead / GiB:.2f} GiB (fragmentation {ALLOCATOR_FRAGMENTATION:.0%}, CUDA context"
                         f"{', NCCL' if s.gpus > 1 else ''}) = {self.total / GiB:.2f} GiB per GPU")
        return "\n".join(lines)


def _layer_saved_bytes_per_token(a: ModelArch, s: TrainingSetup, e: int) -> float:
    """Bytes autograd keeps per token for one decoder layer (see the module docstring, "Activations")."""
    h, inter = a.hidden_size, a.intermediate_size
    q_dim = a.num_heads * a.head_dim
    kv_dim = q_dim if s.padded else a.num_kv_heads * a.head_dim
    t = {g.name for g in a.lora_groups(s.lora_targets)}
    b = 4 * h  # input RMSNorm's fp32 input
    if t & {"q_proj", "k_proj", "v_proj"}:
        b += e * h  # normed hidden read by the LoRA A matrices
    b += e * (q_dim + 2 * kv_dim)  # RoPE'd queries, keys and values saved by SDPA
    b += e * q_dim + 4 * a.num_heads  # SDPA output and its fp32 log-sum-exp
    if "o_proj" in t:
        b += e * q_dim  # contiguous copy read by o_proj's LoRA
    b += 4 * h  # post-attention RMSNorm's fp32 input
    if t & {"gate_proj", "up_proj"}:
        b += e * h
    b += 3 * e * inter  # SiLU input, SiLU output, up_proj output
    if "down_proj" in t:
        b += e * inter  # the product, read by down_proj's LoRA
    if s.lora_dropout > 0:
        per_layer = max(a.num_layers, 1)
        b += sum((e + 1) * g.in_features * g.count for g in a.lora_groups(s.lora_targets)) / per_layer
    return b


def _layer_backward_bytes_per_token(a: ModelArch, e: int) -> float:
    """Gradients alive while one decoder layer runs backward: a few intermediate- and hidden-sized tensors."""
    return e * (4 * a.intermediate_size + 4 * a.hidden_size)


def _weights_bytes(a: ModelArch, s: TrainingSetup, shard: int) -> tuple[float, float]:
    """(resident base-weight bytes incl. quantisation constants, of which quantisation constants) per GPU."""
    if s.device == "cpu":
        return 4.0 * a.total_params, 0.0
    dense = a.dense_params
    linear = a.linear_weight_params
    small = min(a.small_params, dense)
    if s.quant == "none":
        packed, consts = 2.0 * linear, 0.0
    elif s.quant == "nf4":
        packed = 0.5 * linear
        if s.double_quant:
            consts = 1.0 * a.quant_blocks + 4.0 * a.quant_blocks_l2 + 4.0 * a.quant_weights
        else:
            consts = 4.0 * a.quant_blocks
    else:  # int8
        packed, consts = 1.0 * linear, 4.0 * a.int8_scales
    sharded = packed + 2.0 * (dense - small)
    return sharded / shard + 2.0 * small + consts, consts


def _fused_head_bytes(a: ModelArch, s: TrainingSetup, e: int) -> float:
    """Peak memory of TRL's fused LM head in backward (see the module docstring, "Loss logits")."""
    m = s.completions_per_step
    if s.device == "cpu":
        rows = m * (s.seq_len - 1)  # the torch fallback scores every position
    else:
        rows = m * s.max_completion  # Triton: only the completion positions
    tile = min(rows, FUSED_HEAD_TOKEN_TILE) * min(a.vocab_size, FUSED_HEAD_VOCAB_TILE)
    saved_hidden = e * a.hidden_size * rows
    grad_hidden = 4 * a.hidden_size * rows + (e * a.hidden_size * rows if e != 4 else 0)
    per_token = 4 * FUSED_HEAD_FP32_PER_TOKEN * rows
    tile_bytes = e * tile + ((4 * FUSED_HEAD_CPU_FP32_TILES + 1) * tile if s.device == "cpu" else 0)
    return saved_hidden + grad_hidden + per_token + tile_bytes


def _full_logits_bytes(a: ModelArch, s: TrainingSetup, e: int) -> float:
    m = s.completions_per_step
    return FULL_LOGITS_BYTES_PER_ELEMENT * m * s.max_completion * a.vocab_size + e * a.hidden_size * m * s.seq_len


def estimate(arch: ModelArch | str, setup: TrainingSetup) -> MemoryEstimate:
    """Estimate per-GPU memory of one GRPO step of ``arch`` trained as ``setup`` (formulas: module docstring)."""
    a = load_arch(arch) if isinstance(arch, str) else arch
    s = setup
    missing = [t for t in s.lora_targets if t != "all-linear" and a.group(t) is None]
    if missing:
        raise ValueError(f"LoRA target(s) {missing} match no linear layer of {a.name}; its linear layers: "
                         f"{', '.join(g.name for g in a.linears)}")
    cpu = s.device == "cpu"
    e = 4 if cpu else 2  # bytes per activation / LoRA weight element
    n = s.gpus
    param_shard = n if s.zero == 3 else 1
    trainable = a.lora_params(s.lora_rank, s.lora_targets)
    h, L = a.hidden_size, a.num_layers

    weights, consts = _weights_bytes(a, s, param_shard)
    lora = float(e * trainable) / param_shard
    if cpu:
        optimizer = 8.0 * trainable  # AdamW exp_avg + exp_avg_sq, fp32, no master copy
        gradients = 4.0 * trainable
        step_ws = 0.0  # single-tensor AdamW on CPU: per-parameter temporaries only
    else:
        optimizer = 12.0 * trainable / n  # fp32 master + exp_avg + exp_avg_sq, sharded by ZeRO-2 and 3
        gradients = 2.0 * trainable / n + 2.0 * min(trainable, h * h)  # bf16 partition + reduce bucket
        step_ws = 4.0 * trainable / n  # fp32 gradient partition at the step

    # Activations of one micro-batch.
    m = s.completions_per_step
    tokens = m * s.seq_len
    per_layer = _layer_saved_bytes_per_token(a, s, e) * tokens
    mask = (m * s.seq_len * s.seq_len) if s.padded else 0
    final_norm = 4 * h * tokens
    if s.gradient_checkpointing:
        kept = L * e * h * tokens  # each layer's input
        at_head = kept + final_norm + mask
        at_layer = kept + per_layer + mask
    else:
        at_head = L * per_layer + final_norm + mask
        at_layer = at_head
    layer_backward = _layer_backward_bytes_per_token(a, e) * tokens
    activations = at_layer + layer_backward
    logits = _fused_head_bytes(a, s, e) if s.logits == "fused" else _full_logits_bytes(a, s, e)

    # Rollout (not modelled on the CPU, where the check runs one training step).
    dequant = 2.0 * a.largest_linear if s.quant != "none" and not cpu else 0.0
    kv_token = L * 2 * a.num_kv_heads * a.head_dim * e
    seqs = s.decoded_together
    if cpu:
        kv_cache = gen_ws = gen_peak = 0.0
    else:
        kv_cache = float(kv_token * seqs * s.seq_len)
        prompt_kv = kv_token * seqs * s.max_prompt
        attn_tmp = 7 * h + 3 * a.num_kv_heads * a.head_dim
        mlp_tmp = 4 * a.intermediate_size + 2 * h
        prefill = e * seqs * s.max_prompt * max(attn_tmp, mlp_tmp) + (seqs * s.max_prompt ** 2 if s.padded else 0)
        decode = seqs * a.vocab_size * (2 + 4 + 4) + kv_cache / L
        gen_ws = float(max(prefill, decode))
        gen_peak = max(prompt_kv + prefill, kv_cache + decode)

    # ZeRO-3 gathers.
    gather_train = gather_gen = 0.0
    if not cpu and s.zero == 3 and n > 1:
        full, _ = _weights_bytes(a, s, 1)
        full += e * trainable
        layer_bytes = (full - 2.0 * (a.embedding_params + a.lm_head_params)) / L
        biggest = max(2.0 * a.embedding_params, 2.0 * a.lm_head_params, 2 * layer_bytes)
        gather_train = biggest + 2.0 * ZERO3_PREFETCH_FRACTION * h * h
        gather_gen = (full - weights - lora) if s.ds3_gather_for_generation else gather_train

    terms = {
        "weights": weights, "quant_constants": consts, "lora": lora, "optimizer": optimizer, "gradients": gradients,
        "activations": activations, "logits": logits, "kv_cache": kv_cache, "generation_workspace": gen_ws,
        "zero3_gather_generation": gather_gen, "zero3_gather_training": gather_train, "dequant_workspace": dequant,
        "optimizer_step_workspace": step_ws,
    }
    persistent = weights + lora + optimizer
    # The LM head runs backward first. On the GPU DeepSpeed's gradient partition and bucket already exist then
    # (they persist across the micro-steps of a gradient-accumulation window); on the CPU (one micro-step per
    # optimizer step, zero_grad(set_to_none=True)) no gradient exists yet. Decoder backward: all gradients.
    train_head = at_head + logits + (0.0 if cpu else gradients)
    train_layer = activations + gradients
    phases = {
        "training": persistent + gather_train + dequant + max(train_head, train_layer),
        "optimizer_step": persistent + gradients + step_ws,
    }
    if not cpu:
        phases = {"generation": persistent + gather_gen + dequant + gen_peak, **phases}
    allocated = max(phases.values())
    if cpu:
        overhead = 0.0
    else:
        fixed_gb = CUDA_CONTEXT_GB + (NCCL_BUFFERS_GB if n > 1 else 0.0)
        overhead = ALLOCATOR_FRAGMENTATION * allocated + fixed_gb * GiB
    return MemoryEstimate(arch=a, setup=s, trainable_params=trainable, terms=terms, phases=phases, overhead=overhead)


def __getattr__(name: str) -> Any:
    """``agentic_rag.training.memory.check_fits``, the import path docs/guides/memory.md documents, kept working:
    the fit check lives in :mod:`.memory_advice` (imported lazily, as it imports this module)."""
    if name == "check_fits":
        from .memory_advice import check_fits

        return check_fits
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
