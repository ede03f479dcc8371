"""AgenticGRPOTrainer: TRL's GRPOTrainer whose generation is the multi-turn, searching rollout engine.

What it optimises (stated plainly, as every RL recipe should):

* **Rollouts.** Each question is rolled out ``num_generations`` times by :class:`~agentic_rag.rollout.AgentRollout`
  with the current policy (base model + LoRA adapter): the model reasons, searches, reads and answers.
  Tokens the environment inserted (observations, notes, the end-of-sequence token closing a finished
  trajectory) have ``env_mask`` 0; tokens the model wrote have 1.
* **Reward.** The weighted sum of the configured reward functions (each also logged on its own).
* **Advantage.** ``grpo``: ``(r - mean_group) / std_group``; ``dr_grpo``: ``r - mean_group`` (no scaling);
  ``dapo``: DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"): as grpo,
  with the upper clip at 1.28 (clip-higher), token-level aggregation, truncated trajectories masked
  (``mask_truncated_completions``) and dynamic sampling (below). Only the global completion budget
  (``max_completion_tokens``) truncates; a trajectory that ended on ``turn_token_limit`` (a turn that never closed
  its tag) ended as on any other limit: it stays in the loss with its reward (usually 0). DAPO's overlong reward
  shaping is the ``overlong`` reward (:mod:`agentic_rag.training.rewards`), added to the reward list when wanted.
  ``gspo``: GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): grpo's advantage, with one importance
  ratio per trajectory, ``s_i = exp(mean over its model tokens of (log pi - log pi_old))`` (the length-normalised
  sequence ratio), clipped to ``[1 - 3e-4, 1 + 4e-4]`` (the paper's ranges) at the sequence level, per-sequence
  loss averaged over the batch (TRL's ``importance_sampling_level="sequence"``, ``loss_type="grpo"``). On-policy
  (one optimizer step per generation batch, as the quick start trains) every ratio is 1 and its gradient equals
  grpo's; the two differ once a batch is reused (``num_iterations > 1``) or split over several optimizer steps.
  ``cispo``: CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"):
  grpo's advantage; the loss is ``-sg(min(rho_t, eps_max)) * A * log pi(y_t)`` per model token (the importance
  weight clipped and detached, so every token keeps a gradient), summed over the global batch's model tokens and
  divided by their count. ``eps_max`` is ``epsilon_high``, 5.0 by default (TRL's default for it, from ScaleRL; the
  MiniMax report does not publish its value); no lower clip, as in the paper. ``sapo``: SAPO (Gao et al. 2025,
  "Soft Adaptive Policy Optimization"): grpo's advantage; the hard clip is replaced by the soft gate
  ``-(4 / tau) * sigmoid(tau * (rho_t - 1)) * A`` per token, ``tau`` 1.0 for positive advantages and 1.05 for
  the others (the paper's), averaged per sequence then over the batch. ``bnpo``: grpo's advantage and clip, the
  loss summed over each micro-batch's model tokens and divided by their count (TRL's ``bnpo``: the normaliser
  depends on the micro-batch, so its rows are not re-dealt by length).
  All of these give one advantage per completion, shared by its model tokens. ``algorithm.scale_rewards``
  overrides the std scaling of any of them (``group``, ``batch`` or ``none``: TRL's option of that name).
  **Dynamic sampling** (DAPO's; on by default for ``dapo``, ``algorithm.dynamic_sampling`` for the others): a
  group whose rewards are all equal has advantage 0 and no gradient. After each generation batch is scored, such
  groups are dropped and groups of further training questions (drawn at random, seeded) are rolled out and scored
  until every process has as many informative groups as its batch had, or until ``max_extra_rollouts`` more
  rollouts a process were drawn; a batch still short is filled with the dropped groups (advantage 0), so every
  process trains on exactly its batch size. Each round draws ``ceil(missing / p)`` groups, ``p`` the share of
  groups so far informative (at least 1/4), on every process alike. Logged: ``dynamic_sampling/extra_rollouts``,
  ``/zero_variance_groups`` (found, over all rounds), ``/filled`` (zero-variance groups kept to fill) and
  ``/rounds``. Not for the REINFORCE++ pair, whose advantages are normalised over the whole batch.
  ``reinforce_pp``: REINFORCE++ (Hu et al. 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning
  Large Language Models"), one advantage per model token. Each model token gets the reward
  ``r_t = -beta * KL_t`` with the k1 estimate ``KL_t = log pi_old(y_t) - log pi_ref(y_t)``; the completion's
  reward is added at its last model token; the return is ``G_t = sum_{s >= t} r_s`` over its model tokens
  (gamma = 1); the advantage is ``(G_t - mean) / std`` with the mean and the (population) std over all model
  tokens of the global (all-process) batch. No group baseline. ``reinforce_pp_baseline``: the same, after
  subtracting from each reward the mean reward of its question's ``num_generations`` completions: the variant
  R1-Searcher trains with (OpenRLHF's ``reinforce_baseline``). With ``beta = 0`` both reduce to the
  token-weighted, batch-normalised outcome reward broadcast to the model tokens. Environment tokens get no KL
  reward, no return and advantage 0. A completion every reward function calls not applicable gets advantage
  0 (and, in the REINFORCE++ pair, does not count in the mean and std).
* **Loss.** PPO-style clipped ratio ``min(rho * A, clip(rho, 1 - eps, 1 + eps_high) * A)`` per model token,
  plus, except for the REINFORCE++ pair, ``beta * KL`` (the k3 estimator) to the reference policy when
  ``beta > 0``; the REINFORCE++ pair has **no KL term in the loss** (the KL is in the return) and logs its
  k1 ``kl`` from the return. With ``beta = 0`` (the default) no reference log-probabilities are computed and no
  ``kl`` is logged. The reference is the same model with the adapter disabled, or, when training goes on from an
  existing adapter (``model.adapter``), a frozen copy of that adapter as loaded (TRL's ``ref`` adapter).
  ``pi_old`` is the policy that generated the batch, scored by the trainer's own path (not the rollout's
  recorded values), so the KL is exactly 0 while the policy equals the reference. Aggregation: per sequence then
  mean (``grpo``), over all model tokens of the global batch (``dapo``, ``reinforce_pp``,
  ``reinforce_pp_baseline``), or by a constant (``dr_grpo``).
* **Micro-batches.** Each optimizer step's rows are dealt into micro-batches shortest first
  (:func:`group_by_length`) and each micro-batch is scored over its own used columns only (:func:`used_columns`),
  for the losses whose gradient does not depend on which rows share a micro-batch (``ORDER_NEUTRAL_LOSSES``).
  On the quick start's real-model step (64 trajectories, micro-batch 16) this cut the scoring forward from 30 s to
  18 s a step; the loss and gradient are unchanged (tests/test_trainer_scoring.py).
* **Masks.** The policy term and the KL term are multiplied by ``completion_mask * env_mask``: an
  environment token never contributes to the loss, the KL or the gradient.
* **Sampling.** The loss scores tokens with the full-softmax ``log_softmax(logits / temperature)``; top-p < 1,
  top-k, a repetition penalty or decoding processors make the samples off-policy (the config check and the
  trainer warn). FSDP, and ZeRO-3 without ``ds3_gather_for_generation``, are refused: processes decode different
  numbers of steps, which sharded weights cannot serve.
* **Contexts.** After a backtrack or summary, later tokens were generated without the abandoned text; such
  trajectories are scored with a tree-shaped 4D attention mask and their own position ids, so every token's
  log-probability is computed under exactly the context it was generated with. Every scoring pass (old,
  reference and current policy) gives every row its real position ids (the rollout's: 0 at the first prompt
  token, not shifted by left padding), so a row's log-probabilities do not depend on what shares its
  micro-batch. Only sdpa and eager apply the 4D mask, and it replaces a model's sliding-window mask: with a
  dialect whose backtrack or summary branches contexts, other attention kernels (flash attention) and models
  with a sliding window are refused before training (:func:`refuse_tree_masks_it_cannot_serve`; the config
  check refuses them before the model loads).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer
from trl.models import unwrap_model_for_generation

from ..config import DYNAMIC_SAMPLING_BY_DEFAULT
from ..data.prompts import build_prompt, system_prompt
from ..rollout import AgentRollout, HFPolicy, RolloutLimits, SamplingParams
from ..rollout.scoring import layout
from ..rollout.trained_settings import TrainedSettings
from ..rollout.trajectory import ENV, MODEL, Trajectory, search_outcomes
from .model import compact_lm_head_scoring

log = logging.getLogger(__name__)

ALGORITHMS = ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "bnpo", "reinforce_pp", "reinforce_pp_baseline")
KL_IN_RETURN = ("reinforce_pp", "reinforce_pp_baseline")  # REINFORCE++: the KL shapes the reward, not the loss
# The one length cut: the global completion budget. A turn that ran out of tokens (turn_token_limit) without closing its
# tag ended the trajectory like any other limit: it is closed by an EOS, scored (usually 0) and trained on.
LENGTH_ENDINGS = ("max_completion_tokens",)
# TRL losses whose gradient does not depend on which rows of an optimizer step share a micro-batch (equal-sized
# micro-batches): per-sequence means averaged (grpo, sapo), a constant (dr_grpo), or one normaliser over the whole
# step (dapo, cispo, vespo). bnpo divides by each micro-batch's own token count, so its rows are not re-dealt.
ORDER_NEUTRAL_LOSSES = ("grpo", "sapo", "dr_grpo", "dapo", "cispo", "vespo")
COMPLETE_MARKER = ".complete"


def algorithm_args(name: str, *, epsilon: float | None = None, epsilon_high: float | None = None,
                   mask_truncated: bool | None = None, scale_rewards: str | None = None) -> dict[str, Any]:
    """GRPOConfig settings of each algorithm (through TRL's own options wherever they exist), with its paper's
    defaults; a setting given here (not None) replaces the preset's. The REINFORCE++ pair takes TRL's token-level
    aggregation (``loss_type="dapo"``: the sum over all model tokens of the global batch divided by their count)
    with the symmetric clip; their advantages are computed by the trainer
    (:meth:`AgenticGRPOTrainer._reinforce_pp_advantages`), so ``scale_rewards`` does not apply to them."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    token = {"importance_sampling_level": "token", "epsilon": 0.2}
    presets = {
        "grpo": {**token, "loss_type": "grpo", "scale_rewards": "group"},
        "dr_grpo": {**token, "loss_type": "dr_grpo", "scale_rewards": "none"},
        "dapo": {**token, "loss_type": "dapo", "scale_rewards": "group", "epsilon_high": 0.28,
                 "mask_truncated_completions": True},
        "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "scale_rewards": "group",
                 "epsilon": 3e-4, "epsilon_high": 4e-4},
        "cispo": {**token, "loss_type": "cispo", "scale_rewards": "group", "epsilon_high": 5.0},
        "sapo": {**token, "loss_type": "sapo", "scale_rewards": "group", "sapo_temperature_pos": 1.0,
                 "sapo_temperature_neg": 1.05},
        "bnpo": {**token, "loss_type": "bnpo", "scale_rewards": "group"},
        "reinforce_pp": {**token, "loss_type": "dapo", "scale_rewards": "none"},
        "reinforce_pp_baseline": {**token, "loss_type": "dapo", "scale_rewards": "none"},
    }
    args = dict(presets[name])
    if epsilon is not None:
        args["epsilon"] = epsilon
    if epsilon_high is not None:
        args["epsilon_high"] = epsilon_high
    if mask_truncated is not None:
        args["mask_truncated_completions"] = mask_truncated
    if scale_rewards is not None:
        if name in KL_IN_RETURN:
            raise ValueError(f"scale_rewards does not apply to {name}: the trainer whitens its advantages")
        args["scale_rewards"] = scale_rewards
    return args


def informative_groups(rewards: torch.Tensor, group_size: int, tol: float = 1e-6) -> torch.Tensor:
    """``[N / group_size]`` booleans: whether each group of ``group_size`` consecutive rewards (NaN: unscorable,
    ignored) holds two scorable rewards that differ by more than ``tol``, i.e. carries a learning signal."""
    groups = rewards.detach().float().view(-1, group_size)
    finite = ~torch.isnan(groups)
    high = torch.where(finite, groups, -math.inf).max(dim=1).values
    low = torch.where(finite, groups, math.inf).min(dim=1).values
    return (finite.sum(dim=1) >= 2) & (high - low > tol)


def select_rows(pieces: list[tuple[dict[str, Any], list[int]]], pad_token_id: int) -> dict[str, Any]:
    """One scored generation batch made of chosen rows of several (TRL's output dicts): ``pieces`` are ``(output,
    row indices)``. Prompt tensors are left-padded (with ``pad_token_id`` for ids, 0 for masks) and completion
    tensors right-padded to the widest chosen row; per-row lists are concatenated. ``num_items_in_batch`` is left
    for the caller to recount. A key this does not know how to join raises."""
    first = pieces[0][0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if key == "num_items_in_batch":
            continue
        parts = [(o[key], rows) for o, rows in pieces]
        if isinstance(value, list):
            out[key] = [v[i] for v, rows in parts for i in rows]
        elif isinstance(value, torch.Tensor) and value.dim() == 1:
            out[key] = torch.cat([v[rows] for v, rows in parts])
        elif isinstance(value, torch.Tensor) and value.dim() == 2:
            width = max(v.size(1) for v, _ in parts)
            fill = pad_token_id if key.endswith("_ids") else 0
            left = key.startswith("prompt")
            chunks = []
            for v, rows in parts:
                v = v[rows]
                pad = v.new_full((v.size(0), width - v.size(1)), fill)
                chunks.append(torch.cat([pad, v] if left else [v, pad], dim=1))
            out[key] = torch.cat(chunks)
        else:
            raise ValueError(f"dynamic sampling cannot join the generation batch's {key!r}")
    return out


def kl_shaped_returns(rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None,
                      beta: float = 0.0) -> torch.Tensor:
    """REINFORCE++'s per-token returns ``[B, T]`` (Hu et al. 2025, gamma = 1).

    On every model token (``mask`` 1) the reward is ``r_t = -beta * kl_t``, plus the completion's scalar reward
    (``rewards[b]``) on its last model token; the return is ``G_t = sum_{s >= t} r_s`` over the model tokens from
    ``t`` on. Other positions (observations, padding) get no reward and a return of 0. A row without model tokens
    is all 0. ``kl`` may hold anything at positions outside ``mask``."""
    m = mask.to(torch.float32)
    r = torch.zeros_like(m)
    if kl is not None and beta != 0.0:
        r = torch.where(m.bool(), -beta * kl.to(torch.float32), r)
    last = (m * torch.arange(1, m.size(1) + 1, device=m.device)).argmax(dim=1)
    has = m.sum(dim=1) > 0
    rows = torch.arange(m.size(0), device=m.device)[has]
    r[rows, last[has]] += rewards.to(r)[has]
    return r.flip(1).cumsum(1).flip(1) * m


def whiten_over_tokens(values: torch.Tensor, mask: torch.Tensor, reduce=None) -> torch.Tensor:
    """``(values - mean) / std`` with the mean and the (population) variance taken over the tokens where ``mask`` is
    1, the variance floored at 1e-8; 0 elsewhere. ``reduce`` sums a tensor over all processes (the statistics are
    the global batch's); None for one process."""
    m = mask.to(values.dtype)
    stats = torch.stack([(values * m).sum(), m.sum()])
    if reduce is not None:
        stats = reduce(stats)
    count = stats[1].clamp(min=1.0)
    mean = stats[0] / count
    squares = ((values - mean).pow(2) * m).sum()
    if reduce is not None:
        squares = reduce(squares)
    return (values - mean) * (squares / count).clamp(min=1e-8).rsqrt() * m


def refuse_unsupported_launch(args: Any, env: Any = None) -> None:
    """Raise before DeepSpeed starts when the launch is one the rollout would hang under (FSDP, or ZeRO-3 with
    ``args.ds3_gather_for_generation`` false; see :func:`agentic_rag.config.launch_problems`). ``args`` is the
    GRPOConfig: its DeepSpeed plugin knows the ZeRO stage; ``env`` (default: the process environment) the launch."""
    from ..config import launch_from_env, launch_problems

    launch = launch_from_env(os.environ if env is None else env)
    plugin = getattr(args, "deepspeed_plugin", None)
    stage = int(plugin.zero_stage) if plugin is not None else launch["zero_stage"]
    fsdp = bool(getattr(args, "fsdp", None)) or launch["fsdp"]
    problems = launch_problems(zero_stage=stage, fsdp=fsdp, ds3_gather_for_generation=args.ds3_gather_for_generation)
    if problems:
        raise ValueError("; ".join(problems))


def refuse_tree_masks_it_cannot_serve(model: Any, dialect: str, summary_mode: str) -> None:
    """Raise before training when ``dialect`` can branch a trajectory's context (backtrack; summary under
    ``summary_mode`` replace) and ``model`` cannot be scored with the tree-shaped 4D mask such a trajectory needs:
    an attention kernel other than sdpa or eager (flash attention reads the mask as a 2D padding mask), or layers
    that slide over a window the context can outgrow (the mask replaces the window). The config check refuses the
    same before the model loads, where it can read the model's config.json (:func:`agentic_rag.config.
    tree_mask_problems`); this covers every other model (a hub download, a GGUF file, a model built in code)."""
    from ..config import branching_actions, tree_mask_problems

    actions = branching_actions(dialect, summary_mode)
    config = getattr(model, "config", None)
    if not actions or config is None:
        return
    problems = tree_mask_problems(memory=f"dialect {dialect}'s {' and '.join(actions)}",
                                  attn_implementation=getattr(config, "_attn_implementation", None),
                                  model_config=config.to_dict(), model_name=getattr(config, "name_or_path", ""))
    if problems:
        raise ValueError("; ".join(problems))


@dataclass
class AgentSettings:
    """How the trainer rolls out: tools, tag protocol, limits, prompt language and template, algorithm."""

    tools: Any
    dialect: str
    limits: RolloutLimits
    language: str
    chat: bool | None
    algorithm: str
    max_batch_size: int | None
    summary_mode: str
    processors: list  # decoding constraints for the rollout policy (see HFPolicy)
    system: str | None = None  # replaces the dialect's system prompt
    shuffle_rewards: bool = False  # the shuffled-reward control (see _calculate_rewards)
    dynamic_sampling: bool = False  # drop zero-variance groups and refill (see _generate_and_score_completions)
    max_extra_rollouts: int = 0  # the refills' cap, rollouts per process per generation batch
    max_search_failure_rate: float = 0.05  # the run stops when more of its searches fail (see _count_search_failures)


def trained_settings(agent: AgentSettings, tokenizer: Any) -> TrainedSettings:
    """What a saved adapter must be served and evaluated with: the prompt exactly as the rollouts built it (the
    system prompt written out, the chat template resolved as :func:`build_prompt` resolves ``chat=None``) and
    the rollout limits."""
    chat = agent.chat if agent.chat is not None else bool(getattr(tokenizer, "chat_template", None))
    system = agent.system if agent.system is not None else system_prompt(agent.dialect, agent.language)
    return TrainedSettings.from_limits(agent.limits, dialect=agent.dialect, language=agent.language,
                                       system_prompt=system, chat_template=chat, summary_mode=agent.summary_mode,
                                       written_by="grpo")


@dataclass
class TreeLayout:
    """What the loss needs to score a branched trajectory: its real prompt length and segments."""

    trajectory: Trajectory

    def tensors(self, prompt_width: int, completion_width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids ``[P + C]`` and visibility ``[P + C, P + C]`` in TRL's padded layout (prompt
        left-padded to ``P``, completion right-padded to ``C``); padding sees only itself."""
        t = self.trajectory
        pos, vis = layout(t)
        p, c = len(t.prompt_ids), len(t.completion_ids)
        n = prompt_width + completion_width
        positions = torch.zeros(n, dtype=torch.long)
        allowed = torch.eye(n, dtype=torch.bool)
        off = prompt_width - p
        idx = torch.cat([torch.arange(off, prompt_width), torch.arange(prompt_width, prompt_width + c)])
        positions[idx] = pos
        allowed[idx[:, None], idx[None, :]] = vis
        return positions, allowed


def real_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of ordinary rows (``[..., L]``, any device): each real token's index among its row's real
    tokens, as the rollout fed it (0 at the first prompt token, whatever the left padding); padding gets 0, or
    the last real position when it follows real tokens."""
    return (torch.cumsum(attention_mask.long(), -1) - 1).clamp(min=0)


def used_columns(attention_mask: torch.Tensor, prompt_width: int) -> tuple[int, int]:
    """``(first, last)``: the columns of a left-padded prompt + right-padded completion batch that hold a token of at
    least one row, always keeping one completion column. Columns outside are padding in every row: cutting them
    changes no real token's context or position (positions are counted from each row's first real token)."""
    used = attention_mask.bool().any(0).nonzero().flatten().tolist()
    first = min(used[0], prompt_width) if used else prompt_width
    last = max(used[-1] + 1, prompt_width + 1) if used else prompt_width + 1
    return first, last


def group_by_length(batches: list[dict[str, Any]], per_step: int) -> list[dict[str, Any]]:
    """The micro-batches of a generation batch, with each optimizer step's rows (``per_step`` consecutive
    micro-batches) re-dealt shortest first, so that each micro-batch holds rows of similar length and
    :meth:`AgenticGRPOTrainer._get_per_token_logps_and_entropies` cuts its padding. Which rows an optimizer step
    trains on is unchanged, and so is its gradient for every loss whose normalisation does not depend on which
    rows share a micro-batch (:data:`ORDER_NEUTRAL_LOSSES`); only per-micro-batch logged means shift."""
    from trl.trainer.utils import split_tensor_dict

    out: list[dict[str, Any]] = []
    for i in range(0, len(batches), per_step):
        group = batches[i:i + per_step]
        merged: dict[str, Any] = {}
        for key, first in group[0].items():
            values = [b[key] for b in group]
            if first is None or (isinstance(first, torch.Tensor) and first.ndim == 0):
                merged[key] = first
            elif isinstance(first, torch.Tensor):
                merged[key] = torch.cat(values, dim=0)
            else:
                merged[key] = [x for v in values for x in v]
        lengths = merged["prompt_mask"].sum(1) + merged["completion_mask"].sum(1)
        order = torch.argsort(lengths.cpu(), stable=True)
        for key, value in merged.items():
            if isinstance(value, torch.Tensor) and value.ndim > 0:
                merged[key] = value[order.to(value.device)]
            elif isinstance(value, list):
                merged[key] = [value[j] for j in order.tolist()]
        out.extend(split_tensor_dict(merged, len(group)))
    return out


def linear_tensors(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same tensors for an ordinary row: causal over its real tokens."""
    n = attention_mask.shape[0]
    real = attention_mask.bool().cpu()
    positions = real_positions(real)
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool)) & real[None, :] & real[:, None]
    allowed |= torch.eye(n, dtype=torch.bool)
    return positions, allowed


class AgenticGRPOTrainer(GRPOTrainer):
    """GRPO over multi-turn, searching trajectories (see the module docstring for the exact objective)."""

    def __init__(self, model, *, tokenizer, reward_funcs, args: GRPOConfig, train_dataset, tools,
                 dialect: str = "agentic", limits: RolloutLimits | None = None, language: str = "en",
                 chat: bool | None = None, algorithm: str = "grpo", max_batch_size: int | None = None,
                 summary_mode: str = "replace", processors=(), system: str | None = None,
                 shuffle_rewards: bool = False, dynamic_sampling: bool | None = None,
                 max_extra_rollouts: int | None = None, max_search_failure_rate: float = 0.05, peft_config=None,
                 callbacks=None):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
        if dynamic_sampling is None:
            dynamic_sampling = algorithm in DYNAMIC_SAMPLING_BY_DEFAULT
        per_generation = args.per_device_train_batch_size * args.steps_per_generation
        if dynamic_sampling:
            if algorithm in KL_IN_RETURN:
                raise ValueError(f"dynamic sampling does not apply to {algorithm}: its advantages are normalised over "
                                 "the whole batch, not within groups")
            if per_generation % args.num_generations:
                raise ValueError(f"dynamic sampling drops and refills whole groups on each process: the rollouts a "
                                 f"process generates at once (per_device_train_batch_size x steps_per_generation = "
                                 f"{per_generation}) must be a multiple of num_generations ({args.num_generations})")
        if max_extra_rollouts is not None and max_extra_rollouts < 0:
            raise ValueError(f"max_extra_rollouts must be >= 0, got {max_extra_rollouts}")
        refuse_unsupported_launch(args)
        refuse_tree_masks_it_cannot_serve(model, dialect, summary_mode)
        if processors:
            log.warning("%d decoding processor(s) shape what the rollouts sample, but the loss scores tokens with "
                        "full-softmax log-probabilities: the samples are off-policy and the importance ratio (and "
                        "the KL) is biased. Pass no processors for on-policy training.", len(processors))
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        limits = limits or RolloutLimits(max_completion_tokens=args.max_completion_length or 1024)
        if args.max_completion_length and limits.max_completion_tokens > args.max_completion_length:
            raise ValueError(f"rollout max_completion_tokens ({limits.max_completion_tokens}) exceeds the "
                             f"trainer's max_completion_length ({args.max_completion_length})")
        # one attribute, so nothing collides with GRPOTrainer's own (it has a `tools` of its own, for one)
        self.agent = AgentSettings(tools=tools, dialect=dialect, limits=limits, language=language, chat=chat,
                                   algorithm=algorithm, max_batch_size=max_batch_size, summary_mode=summary_mode,
                                   processors=list(processors), system=system or None,
                                   shuffle_rewards=shuffle_rewards, dynamic_sampling=bool(dynamic_sampling),
                                   max_extra_rollouts=per_generation if max_extra_rollouts is None
                                   else max_extra_rollouts, max_search_failure_rate=max_search_failure_rate)
        self._search_totals = [0, 0]  # failed searches, searches, over the run (all processes)
        self._shuffle_step, self._shuffle_calls = -1, 0  # the shuffled-reward control's position (step, call)
        self._prompt_cache: dict[str, list[int]] = {}
        self._active_layouts: list[TreeLayout | None] | None = None
        self._active_env: list[list[int]] | torch.Tensor | None = None  # env_mask of the rows being scored
        self._last_trajectories: list[Trajectory] = []
        self._rewards_per_func: torch.Tensor | None = None
        compact_lm_head_scoring()
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                         processing_class=tokenizer, peft_config=peft_config, rollout_func=self._rollout,
                         callbacks=callbacks)

    # ------------------------------------------------------------------------------------------ rollouts

    def _prompt_ids(self, question: Any) -> list[int]:
        if not isinstance(question, str):
            raise TypeError("training prompts must be question strings (the 'prompt' column); the rollout "
                            "applies the dialect's system prompt and the chat template itself")
        ids = self._prompt_cache.get(question)
        if ids is None:
            a = self.agent
            ids = build_prompt(self.processing_class, question, a.dialect, language=a.language, chat=a.chat,
                               system=a.system)
            self._prompt_cache[question] = ids
        return ids

    def _rollout(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        """TRL's rollout_func: prompts arrive already repeated ``num_generations`` times."""
        tok = self.processing_class
        args = self.args
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                  top_k=args.top_k or 0, repetition_penalty=args.repetition_penalty)
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                         gather_deepspeed3_params=args.ds3_gather_for_generation,
                                         gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs) as model:
            a = self.agent
            policy = HFPolicy(model, tok, sampling, max_batch_size=a.max_batch_size, processors=a.processors)
            with AgentRollout(policy, tok, a.tools, a.dialect, a.limits, summary_mode=a.summary_mode) as engine:
                trajs = engine.run([self._prompt_ids(q) for q in prompts], [str(q) for q in prompts])
        eos = tok.eos_token_id
        for t in trajs:
            # A trajectory that ended on its own (answer, EOS, or a behavioural limit, turn_token_limit included) is
            # closed by an end-of-sequence token from the environment, so TRL counts only the completion budget as a
            # length cut (mask_truncated_completions). There is room: turn_token_limit leaves budget unspent.
            if t.finish_reason not in LENGTH_ENDINGS and (not t.completion_ids or t.completion_ids[-1] != eos):
                t.append([eos], ENV)
        self._last_trajectories = trajs
        self._active_layouts = [None if t.is_linear else TreeLayout(t) for t in trajs]
        self._active_env = [t.env_mask for t in trajs]
        self._log_rollouts(trajs)
        return {
            "prompt_ids": [t.prompt_ids for t in trajs],
            "completion_ids": [t.completion_ids for t in trajs],
            "logprobs": [t.logprobs for t in trajs] if all(t.logprobs is not None for t in trajs) else None,
            "env_mask": [t.env_mask for t in trajs],
            "trajectory": [self._view(t) for t in trajs],
        }

    def _prepare_inputs(self, generation_batch):
        """TRL's buffering, then each optimizer step's rows dealt into micro-batches by length
        (:func:`group_by_length`), when the loss allows it: a rollout batch mixes one-search answers with
        three-search trajectories twice as long, and a micro-batch is as wide as its longest row."""
        args = self.args
        fresh = self.model.training and (self._step % (args.steps_per_generation * self.num_iterations) == 0
                                         or self._buffered_inputs is None)
        inputs = super()._prepare_inputs(generation_batch)
        per_step = args.gradient_accumulation_steps
        if (fresh and self.loss_type in ORDER_NEUTRAL_LOSSES and args.top_entropy_quantile >= 1.0
                and per_step > 1 and args.steps_per_generation % per_step == 0):
            self._buffered_inputs = group_by_length(self._buffered_inputs, per_step)
            inputs = self._buffered_inputs[self._step % args.steps_per_generation]
        return inputs

    def _view(self, t: Trajectory) -> dict[str, Any]:
        """What reward functions see of a trajectory: text, answer, events; no token ids."""
        tok = self.processing_class
        model_text = "".join(tok.decode(t.completion_ids[s.start:s.end], skip_special_tokens=False)
                             for s in t.segments if s.source == MODEL)
        return {"question": t.question, "answer": t.answer, "model_text": model_text, "events": t.events,
                "prompt_tail": tok.decode(t.prompt_ids[-16:], skip_special_tokens=False),
                "finish_reason": t.finish_reason, "num_searches": t.num_searches, "num_turns": t.num_turns}

    def _log_rollouts(self, trajs: list[Trajectory]) -> None:
        mode = "train" if self.model.training else "eval"
        device = self.accelerator.device
        stats = torch.tensor([[t.num_searches, t.num_turns, t.model_tokens, t.env_tokens, float(not t.is_linear),
                               float(t.finish_reason == "answer"),
                               float(any(e["type"] == "error" for e in t.events)), *search_outcomes(t.events)]
                              for t in trajs], dtype=torch.float32, device=device)
        rows = self.accelerator.gather(stats)
        gathered = rows.mean(0).tolist()
        names = ["searches_per_trajectory", "turns_per_trajectory", "model_tokens", "env_tokens_masked",
                 "branched_fraction", "answered_fraction", "tool_error_fraction"]
        for name, value in zip(names, gathered[:len(names)], strict=True):
            self._metrics[mode][f"agentic/{name}"].append(value)
        failed, searches = int(rows[:, 7].sum().item()), int(rows[:, 8].sum().item())
        self._metrics[mode]["agentic/search_failure_rate"].append(failed / searches if searches else 0.0)
        self._count_search_failures(failed, searches)
        reasons = Counter(t.finish_reason for t in trajs)
        for reason, n in reasons.items():
            self._metrics[mode][f"agentic/finish/{reason}"].append(n / len(trajs))

    def _count_search_failures(self, failed: int, searches: int) -> None:
        """Stop the run (:class:`~agentic_rag.errors.SearchFailuresError`, on every process alike: the counts are
        gathered) when its searches fail: every search of a batch of at least 10, or more than
        ``max_search_failure_rate`` of the run's searches once it has made 50. Rewards earned with error
        observations instead of passages would train the model on a broken search target. The last complete
        checkpoint stays; fix the searcher and go on with ``--resume``."""
        from ..errors import SearchFailuresError

        self._search_totals[0] += failed
        self._search_totals[1] += searches
        total_failed, total = self._search_totals
        limit = self.agent.max_search_failure_rate
        whole_batch = searches >= 10 and failed == searches
        if whole_batch or (total >= 50 and total_failed / total > limit):
            raise SearchFailuresError(
                f"training stopped at step {self.state.global_step}: {failed} of {searches} searches of the last "
                f"rollout batch failed, {total_failed} of {total} over the run ({total_failed / total:.1%}; "
                f"search.max_failure_rate is {limit:.1%}). Check the search target (search.index), then continue with "
                f"--resume")

    # ---------------------------------------------------------------------------------- advantages

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.agent.shuffle_rewards:
            # The control run: every completion gets the rewards of a random other completion of the batch
            # (all reward functions permuted together). The batch's reward distribution, and so every logged
            # reward mean, is unchanged; what is lost is which completion earned it. The permutation depends
            # only on the seed, the optimizer step and the call count within that step (dynamic sampling scores
            # several batches a step), so all processes apply the same one to the gathered rows, and a run resumed
            # from a checkpoint draws the permutations the uninterrupted run would have drawn.
            step = int(self.state.global_step)
            if step != self._shuffle_step:
                self._shuffle_step, self._shuffle_calls = step, 0
            gen = torch.Generator().manual_seed(self.args.seed * 1_000_003 + step * 1_009 + self._shuffle_calls)
            self._shuffle_calls += 1
            rewards = rewards[torch.randperm(rewards.shape[0], generator=gen).to(rewards.device)]
        self._rewards_per_func = rewards
        return rewards

    def _generate_and_score_completions(self, inputs):
        output = self._score_batch(inputs)
        if self.agent.dynamic_sampling and self.model.training:
            output = self._refill_informative_groups(inputs, output)
        return output

    def _score_batch(self, inputs):
        """TRL's generation and scoring of ``inputs`` (the REINFORCE++ advantages where they apply), with each
        row's tree layout for the loss."""
        try:
            output = super()._generate_and_score_completions(inputs)
            if self.agent.algorithm in KL_IN_RETURN:  # while the rows' layouts are still set (old log-probs)
                output["advantages"] = self._reinforce_pp_output(output)
        finally:
            layouts, self._active_layouts = self._active_layouts, None
            self._active_env = None
        output["agentic_layout"] = layouts if layouts is not None else [None] * len(output["advantages"])
        return output

    def _outcome_rewards(self) -> torch.Tensor:
        """The weighted sum of the reward functions for every completion of the batch just scored, gathered from
        all processes (NaN where every function is not applicable)."""
        per_func = self._rewards_per_func
        rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(per_func).all(dim=1)] = float("nan")
        return rewards

    def _local_informative(self, local_rows: int) -> list[bool]:
        """Whether each of this process's groups in the batch just scored carries a signal, from the gathered
        rewards of all processes (so every process decides alike)."""
        flags = informative_groups(self._outcome_rewards(), self.num_generations)
        per_process = local_rows // self.num_generations
        start = self.accelerator.process_index * per_process
        return flags[start:start + per_process].tolist()

    def _draw_groups(self, groups: int, round_: int) -> list[dict[str, Any]]:
        """``groups`` training questions at random (seeded by the seed, the step, the round and the process), each
        repeated ``num_generations`` times as TRL's sampler repeats them."""
        gen = torch.Generator().manual_seed(hash((self.args.seed, self.state.global_step, round_,
                                                  self.accelerator.process_index)) % (2 ** 63))
        picks = torch.randint(len(self.train_dataset), (groups,), generator=gen).tolist()
        return [dict(self.train_dataset[i]) for i in picks for _ in range(self.num_generations)]

    def _refill_informative_groups(self, inputs, output):
        """DAPO's dynamic sampling (see the module docstring): the batch's zero-variance groups replaced by
        informative groups of further questions, as far as the cap allows; the same number of rows as before."""
        group, rows = self.num_generations, len(inputs)
        wanted = rows // group
        device = self.accelerator.device
        flags = self._local_informative(rows)
        found = [(output, g) for g, ok in enumerate(flags) if ok]
        zero = [(output, g) for g, ok in enumerate(flags) if not ok]
        seen, informative, drawn, rounds = len(flags), len(found), 0, 0
        while True:
            missing = max(0, wanted - len(found))
            stats = self.accelerator.gather(torch.tensor([[missing, seen, informative]], device=device,
                                                         dtype=torch.float32)).view(-1, 3)
            most_missing = int(stats[:, 0].max())
            share = max(float(stats[:, 2].sum() / stats[:, 1].sum().clamp(min=1)), 0.25)
            groups = min(math.ceil(most_missing / share), (self.agent.max_extra_rollouts - drawn) // group)
            if most_missing == 0 or groups <= 0:
                break
            rounds += 1
            extra = self._score_batch(self._draw_groups(groups, rounds))
            drawn += groups * group
            flags = self._local_informative(groups * group)
            seen, informative = seen + len(flags), informative + sum(flags)
            found += [(extra, g) for g, ok in enumerate(flags) if ok]
            zero += [(extra, g) for g, ok in enumerate(flags) if not ok]
        chosen = found[:wanted]
        filled = wanted - len(chosen)
        chosen += zero[:filled]
        pieces: list[tuple[dict[str, Any], list[int]]] = []
        for out, g in chosen:
            if pieces and pieces[-1][0] is out:
                pieces[-1][1].extend(range(g * group, (g + 1) * group))
            else:
                pieces.append((out, list(range(g * group, (g + 1) * group))))
        merged = select_rows(pieces, self.processing_class.pad_token_id)
        loss_mask = merged["completion_mask"] * merged.get("tool_mask", 1)
        merged["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        totals = self.accelerator.gather(torch.tensor([[drawn, seen - informative, filled, rounds]], device=device,
                                                      dtype=torch.float32)).view(-1, 4)
        metrics = self._metrics["train"]
        metrics["dynamic_sampling/extra_rollouts"].append(float(totals[:, 0].sum()))
        metrics["dynamic_sampling/zero_variance_groups"].append(float(totals[:, 1].sum()))
        metrics["dynamic_sampling/filled"].append(float(totals[:, 2].sum()))
        metrics["dynamic_sampling/rounds"].append(float(totals[:, 3].max()))
        return merged

    def _reinforce_pp_output(self, output: dict[str, Any]) -> torch.Tensor:
        """The REINFORCE++ advantages ``[B, T]`` of a scored generation batch (see the module docstring).

        The outcome reward is the weighted sum of the reward functions (NaN when every one is not applicable).
        With ``beta > 0`` the KL is ``log pi_old - log pi_ref`` per model token: TRL computed the reference
        log-probabilities (it does whenever ``beta != 0``), and the old policy's are TRL's when it computed them,
        else scored here, once, by the same path and weights that generated the batch. Logs ``kl``: the mean k1
        KL over the model tokens of the global batch."""
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        mask = output["completion_mask"]
        if "tool_mask" in output:
            mask = mask * output["tool_mask"]
        rewards = self._outcome_rewards()
        kl = None
        if self.beta != 0.0:
            old = output.get("old_per_token_logps")
            if old is None:
                old = self._policy_logps(output)
            kl = torch.where(mask.bool(), old - output["ref_per_token_logps"], 0.0)
            stats = self.accelerator.reduce(torch.stack([kl.sum(), mask.sum().to(kl.dtype)]), reduction="sum")
            self._metrics[mode]["kl"].append((stats[0] / stats[1].clamp(min=1.0)).item())
        return self._reinforce_pp_advantages(rewards, mask, kl, group)

    def _policy_logps(self, output: dict[str, Any]) -> torch.Tensor:
        """Per-token log-probabilities of the batch under the current (= old: it just generated it) policy, scored
        as TRL scores the reference (no gradient, gradient checkpointing off)."""
        from trl.models.utils import disable_gradient_checkpointing

        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        batch = self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attention,
                                                                  output["completion_ids"].size(1), batch_size=batch)
        return logps

    def _reinforce_pp_advantages(self, rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None,
                                 group_size: int) -> torch.Tensor:
        """Per-token advantages ``[B, T]`` of this process's rows.

        ``rewards``: the outcome reward of every completion of the global batch, in TRL's gathered order (groups
        of ``group_size`` consecutive completions; NaN: unscorable); ``mask``: this process's model tokens
        ``[B, T]``; ``kl``: ``log pi_old - log pi_ref`` there, or None. ``reinforce_pp_baseline`` first subtracts
        each group's mean reward; then :func:`kl_shaped_returns` with ``self.beta`` and :func:`whiten_over_tokens`
        over the model tokens of all processes. An unscorable completion gets 0 and does not count."""
        rewards = rewards.to(torch.float32)
        if self.agent.algorithm == "reinforce_pp_baseline":
            groups = rewards.view(-1, group_size)
            rewards = (groups - torch.nanmean(groups, dim=1, keepdim=True)).view(-1)
        start = self.accelerator.process_index * mask.size(0)
        local = rewards[start:start + mask.size(0)].to(mask.device)
        mask = mask * ~torch.isnan(local)[:, None]
        returns = kl_shaped_returns(local.nan_to_num(0.0), mask, kl, self.beta)
        return whiten_over_tokens(returns, mask, reduce=lambda t: self.accelerator.reduce(t, reduction="sum"))

    # --------------------------------------------------------------------------------------- scoring

    def _compute_loss(self, model, inputs):
        self._active_layouts = inputs.get("agentic_layout")
        self._active_env = inputs.get("tool_mask")
        beta = self.beta
        if self.agent.algorithm in KL_IN_RETURN:
            # REINFORCE++: the KL is in the advantages already; TRL would add beta * KL (k3) to the loss. beta stays
            # set outside the loss, so TRL keeps the reference and computes its log-probabilities for the return.
            self.beta = 0.0
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self.beta = beta
            self._active_layouts, self._active_env = None, None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        """TRL's scoring, with three differences. Every row gets explicit, real position ids
        (:func:`real_positions`), so the old, reference and current log-probabilities of a row are the same
        function of its tokens whatever shares its micro-batch. Branched trajectories (backtrack, summary) get a
        tree-shaped 4D mask and the tree's position ids (the plain rows beside them keep theirs). And environment
        tokens are not scored: their labels are -100, so the
        fused LM head, which projects only labelled positions, skips them; they still pass through the
        backbone as context. Their log-probability (and entropy) comes back as 0 and is masked out of the
        loss, the KL and the metrics by ``completion_mask * env_mask`` anyway; an observation-heavy
        trajectory no longer pays the vocabulary projection, in time and memory, for text it did not write."""
        if any(v is not None for v in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
        layouts, env = self._active_layouts, self._env_tensor(logits_to_keep, input_ids)
        if layouts is not None and len(layouts) != input_ids.size(0):
            raise RuntimeError(f"{len(layouts)} layouts for a batch of {input_ids.size(0)} rows")
        batch_size = batch_size or input_ids.size(0)
        prompt_width = input_ids.size(1) - logits_to_keep
        all_logps, all_entropies, all_aux = [], [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            # Only this micro-batch's own extent goes through the model: the columns that are padding in every
            # one of its rows (left of the longest prompt, right of the longest completion) are cut off, and the
            # completion's log-probabilities are padded back with zeros (masked out downstream anyway).
            first, last = used_columns(attention_mask[start:end], prompt_width)
            keep = last - prompt_width
            ids, mask = input_ids[start:end, first:last], attention_mask[start:end, first:last]
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :-keep] = -100
            if env is not None:
                labels[:, -keep:] = labels[:, -keep:].masked_fill(env[start:end, :keep] == 0, -100)
            # the real position ids always: TRL's default (the model's arange over the padded row) would shift a
            # left-padded row, and differently from the tree path its micro-batch may take
            kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "position_ids": real_positions(mask)}
            if layouts is not None and any(layouts[start:end]):
                tree = self._tree_inputs(model, layouts[start:end], attention_mask[start:end], prompt_width,
                                         logits_to_keep)
                kwargs["attention_mask"] = tree["attention_mask"][:, :, first:last, first:last]
                kwargs["position_ids"] = tree["position_ids"][:, first:last]
            if compute_aux_loss:
                kwargs["output_router_logits"] = True
            with self.accelerator.autocast():
                out = model(**kwargs, labels=labels, fused_lm_head=True)
            pad = (0, logits_to_keep - keep)
            all_logps.append(torch.nn.functional.pad(out.log_probs[:, -keep:], pad))
            if compute_entropy:
                all_entropies.append(torch.nn.functional.pad(out.entropy[:, -keep:], pad))
            if compute_aux_loss:
                all_aux.append(out.aux_loss)
        logps = torch.cat(all_logps, dim=0)
        entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
        aux = torch.stack(all_aux).mean() if compute_aux_loss else None
        return logps, entropies, aux

    def _env_tensor(self, width: int, input_ids: torch.Tensor) -> torch.Tensor | None:
        """The env_mask of the rows being scored as a ``[rows, width]`` tensor (1 where padding), or None."""
        env = self._active_env
        if env is None:
            return None
        if isinstance(env, torch.Tensor):
            out = env[:, :width]
        else:
            out = torch.ones((len(env), width), dtype=torch.long)
            for i, m in enumerate(env):
                out[i, :min(len(m), width)] = torch.tensor(m[:width], dtype=torch.long)
        if out.shape[0] != input_ids.size(0):
            raise RuntimeError(f"env masks for {out.shape[0]} rows, a batch of {input_ids.size(0)}")
        return out.to(input_ids.device)

    @staticmethod
    def _tree_inputs(model, layouts, attention_mask, prompt_width: int, completion_width: int) -> dict[str, Any]:
        """Position ids and an additive 4D mask for a micro-batch that holds a branched trajectory."""
        dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            dtype = torch.bfloat16
        positions, allowed = [], []
        for row_mask, lay in zip(attention_mask, layouts, strict=True):
            pos, vis = (lay.tensors(prompt_width, completion_width) if lay is not None
                        else linear_tensors(row_mask))
            positions.append(pos)
            allowed.append(vis)
        device = attention_mask.device
        n = prompt_width + completion_width
        additive = torch.zeros((len(layouts), 1, n, n), dtype=dtype, device=device)
        additive.masked_fill_(~torch.stack(allowed)[:, None].to(device), torch.finfo(dtype).min)
        # Model segments always follow their parent directly (only environment notes start a branch), so the
        # ordinary shift (position i predicts token i + 1) is right for every token that is trained on.
        return {"attention_mask": additive, "position_ids": torch.stack(positions).to(device)}

    # ----------------------------------------------------------------------------------- checkpoints

    def _save_checkpoint(self, model, trial):
        """Save as TRL does, but crash-safe: rotation waits until the new checkpoint is complete.

        Transformers deletes old checkpoints (``save_total_limit``) at the end of its save, before we could mark
        the new one complete: a kill in between would leave no complete checkpoint at all with a limit of 1. So
        the save runs with rotation off; once every process has written its part the marker goes in, and only
        then are old checkpoints deleted, counting complete ones only (:func:`rotate_checkpoints`). The adapter's
        rollout settings (:func:`trained_settings`) are written into the checkpoint before its marker."""
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        limit = self.args.save_total_limit
        self.args.save_total_limit = None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            run_dir = Path(self._get_output_dir(trial=trial))
            checkpoint = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            trained_settings(self.agent, self.processing_class).write(checkpoint)
            write_marker(checkpoint)
            rotate_checkpoints(run_dir, limit, keep=self.state.best_model_checkpoint)


CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def write_marker(checkpoint: Path) -> None:
    """Mark ``checkpoint`` complete, durably (the marker and the directory entry are synced to disk)."""
    marker = checkpoint / COMPLETE_MARKER
    with open(marker, "w") as f:
        f.write("complete\n")
        f.flush()
        os.fsync(f.fileno())
    dir_fd = os.open(checkpoint, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``checkpoint-N`` directories of ``root``, newest (highest step) first; quarantined ones do not match."""
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_NAME.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def rotate_checkpoints(output_dir: str | os.PathLike, limit: int | None, *, keep: str | None = None) -> list[str]:
    """Delete the oldest complete checkpoints beyond the newest ``limit`` complete ones; returns what was deleted.

    Only ``checkpoint-N`` directories with a completion marker count and are ever deleted: an incomplete one
    (being written, or left by a kill) and a quarantined ``checkpoint-N.incomplete-*`` neither count toward the
    limit nor push a complete checkpoint out. ``keep`` (the best checkpoint, when there is one) is never deleted.
    No limit (None or <= 0) keeps everything."""
    import shutil

    if not limit or limit <= 0:
        return []
    complete = [p for _step, p in _checkpoints(Path(output_dir)) if (p / COMPLETE_MARKER).is_file()]
    protected = {Path(keep).resolve()} if keep else set()
    deleted = []
    for path in complete[limit:]:
        if path.resolve() in protected:
            continue
        # drop the marker first: a kill halfway through the deletion leaves an incomplete checkpoint, not a
        # "complete" one with files missing
        (path / COMPLETE_MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(str(path))
    return deleted


def latest_complete_checkpoint(output_dir: str | os.PathLike, *, quarantine: bool = True) -> str | None:
    """The newest checkpoint with a completion marker. Incomplete ones (a process killed while saving) are
    renamed out of the way so nothing later mistakes them for checkpoints."""
    import time

    root = Path(output_dir)
    if not root.is_dir():
        return None
    for _step, path in _checkpoints(root):
        if (path / COMPLETE_MARKER).is_file():
            return str(path)
        if quarantine:
            target = path.with_name(f"{path.name}.incomplete-{int(time.time())}")
            log.warning("checkpoint %s is incomplete (interrupted while saving); moved to %s", path, target.name)
            path.rename(target)
    return None


def steps_for(num_questions: int, args: GRPOConfig) -> int:
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps / max(1, args.num_generations)
    return max(1, math.ceil(num_questions / per_step))
