"""The algorithm presets: the one place their names are written (``algorithm.name`` in the experiment config).

Each preset is one :class:`Preset` record in :data:`PRESETS`: the TRL options it trains with (TRL's own
``loss_type``, ``importance_sampling_level``, clip range, ``scale_rewards``, ``mask_truncated_completions``) and
what the trainer does around them (dynamic sampling by default, the KL in the return, a group baseline, whether the
loss lets the trainer re-deal an optimizer step's rows by length). Nothing here imports torch or TRL, so the config
check and the command line read the names without loading either.

What each preset computes (its ``help`` is the one-line version):

* ``grpo``: the advantage ``(r - mean_group) / std_group``; PPO's clipped ratio per model token, the loss averaged
  per sequence, then over the sequences.
* ``dr_grpo``: Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"): the
  advantage ``r - mean_group`` (no std scaling); the loss summed and divided by a constant.
* ``dapo``: DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"): as grpo, with
  the upper clip at 1.28 (clip-higher), token-level aggregation, truncated trajectories masked
  (``mask_truncated_completions``) and dynamic sampling (below). Only the global completion budget
  (``max_completion_tokens``) truncates; a trajectory that ended on ``turn_token_limit`` (a turn that never closed
  its tag) ended as on any other limit: it stays in the loss with its reward (usually 0). DAPO's overlong reward
  shaping is the ``overlong`` reward (:mod:`agentic_rag.training.rewards`), added to the reward list when wanted.
* ``gspo``: GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): grpo's advantage, with one importance
  ratio per trajectory, ``s_i = exp(mean over its model tokens of (log pi - log pi_old))`` (the length-normalised
  sequence ratio), clipped to ``[1 - 3e-4, 1 + 4e-4]`` (the paper's ranges) at the sequence level, per-sequence
  loss averaged over the batch (TRL's ``importance_sampling_level="sequence"``, ``loss_type="grpo"``). On-policy
  (one optimizer step per generation batch, as the quick start trains) every ratio is 1 and its gradient equals
  grpo's; the two differ once a batch is reused (``num_iterations > 1``) or split over several optimizer steps.
* ``cispo``: CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"):
  grpo's advantage; the loss is ``-sg(min(rho_t, eps_max)) * A * log pi(y_t)`` per model token (the importance
  weight clipped and detached, so every token keeps a gradient), summed over the global batch's model tokens and
  divided by their count. ``eps_max`` is ``epsilon_high``, 5.0 by default (TRL's default for it, from ScaleRL; the
  MiniMax report does not publish its value); no lower clip, as in the paper.
* ``sapo``: SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization"): grpo's advantage; the hard clip is
  replaced by the soft gate ``-(4 / tau) * sigmoid(tau * (rho_t - 1)) * A`` per token, ``tau`` 1.0 for positive
  advantages and 1.05 for the others (the paper's), averaged per sequence then over the batch.
* ``bnpo``: grpo's advantage and clip, the loss summed over each micro-batch's model tokens and divided by their
  count (TRL's ``bnpo``: the normaliser depends on the micro-batch, so its rows are not re-dealt by length).
* ``reinforce_pp``: REINFORCE++ (Hu et al. 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
  Language Models"), one advantage per model token. Each model token gets the reward ``r_t = -beta * KL_t`` with
  the k1 estimate ``KL_t = log pi_old(y_t) - log pi_ref(y_t)``; the completion's reward is added at its last model
  token; the return is ``G_t = sum_{s >= t} r_s`` over its model tokens (gamma = 1); the advantage is
  ``(G_t - mean) / std`` with the mean and the (population) std over all model tokens of the global (all-process)
  batch (:mod:`agentic_rag.training.reinforce_pp`). No group baseline. The loss is TRL's token-level aggregation
  (``loss_type="dapo"``) with the symmetric clip and **no KL term** (the KL is in the return).
* ``reinforce_pp_baseline``: the same, after subtracting from each reward the mean reward of its question's
  ``num_generations`` completions: the variant R1-Searcher trains with (OpenRLHF's ``reinforce_baseline``).

With ``beta = 0`` the REINFORCE++ pair reduces to the token-weighted, batch-normalised outcome reward broadcast to
the model tokens. Every other preset gives one advantage per completion, shared by its model tokens, and adds
``beta * KL`` (the k3 estimator) to the loss when ``beta > 0``. ``algorithm.scale_rewards`` overrides the std
scaling of any of them (``group``, ``batch`` or ``none``: TRL's option of that name); it does not apply to the
REINFORCE++ pair, whose advantages the trainer whitens.

**Dynamic sampling** (DAPO's; on by default for the presets with ``dynamic_sampling_default``, by
``algorithm.dynamic_sampling`` for the others; :mod:`agentic_rag.training.dynamic_sampling`): a group whose rewards
are all equal has advantage 0 and no gradient; such groups are dropped and groups of further training questions
rolled out until every process has as many informative groups as its batch had. Not for the presets with the KL in
the return, whose advantages are normalised over the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Preset:
    """One algorithm preset: the GRPOConfig options it trains with and what the trainer does around them."""

    name: str
    loss_type: str  # TRL's GRPOConfig.loss_type
    help: str  # one line: what it computes (the config's help lists these)
    paper: str = ""  # where it comes from
    importance_sampling_level: str = "token"  # TRL's: "token" or "sequence"
    epsilon: float = 0.2  # the clip range below 1
    epsilon_high: float | None = None  # the clip range above 1 (None: epsilon); cispo: the weight's cap
    scale_rewards: str = "group"  # TRL's std scaling of the advantage: group, batch or none
    mask_truncated: bool | None = None  # TRL's mask_truncated_completions (None: TRL's default)
    trl_options: tuple[tuple[str, Any], ...] = ()  # further GRPOConfig options, as (name, value)
    dynamic_sampling_default: bool = False  # drop zero-variance groups and refill unless told otherwise
    kl_in_return: bool = False  # REINFORCE++: the KL shapes each token's reward, not the loss; per-token advantages
    group_baseline: bool = False  # (with kl_in_return) subtract each question's mean reward first
    order_neutral: bool = True  # the loss's gradient does not depend on which rows share a micro-batch


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("grpo", "grpo", "the group-normalised advantage, the loss averaged per sequence",
           "Shao et al. 2024, DeepSeekMath"),
    Preset("dr_grpo", "dr_grpo", "no std scaling, a constant normaliser",
           "Liu et al. 2025, Understanding R1-Zero-Like Training", scale_rewards="none"),
    Preset("dapo", "dapo", "clip-higher, token-level loss, dynamic sampling",
           "Yu et al. 2025, DAPO", epsilon_high=0.28, mask_truncated=True, dynamic_sampling_default=True),
    Preset("gspo", "grpo", "sequence-level importance ratio",
           "Zheng et al. 2025, Group Sequence Policy Optimization", importance_sampling_level="sequence",
           epsilon=3e-4, epsilon_high=4e-4),
    Preset("cispo", "cispo", "clipped, detached importance weights",
           "MiniMax 2025, MiniMax-M1", epsilon_high=5.0),
    Preset("sapo", "sapo", "a soft gate instead of the clip",
           "Gao et al. 2025, Soft Adaptive Policy Optimization",
           trl_options=(("sapo_temperature_pos", 1.0), ("sapo_temperature_neg", 1.05))),
    Preset("bnpo", "bnpo", "a per-micro-batch token mean", order_neutral=False),
    Preset("reinforce_pp", "dapo", "REINFORCE++: KL-shaped per-token returns, normalised over the batch's tokens",
           "Hu et al. 2025, REINFORCE++", scale_rewards="none", kl_in_return=True),
    Preset("reinforce_pp_baseline", "dapo",
           "the same after subtracting each question's mean reward, as R1-Searcher trains",
           "Hu et al. 2025, REINFORCE++; OpenRLHF's reinforce_baseline", scale_rewards="none", kl_in_return=True,
           group_baseline=True),
)}

DEFAULT_ALGORITHM = "grpo"
# REINFORCE++: the KL shapes the reward, not the loss
KL_IN_RETURN = tuple(name for name, p in PRESETS.items() if p.kl_in_return)
# DAPO's recipe samples dynamically unless told otherwise
DYNAMIC_SAMPLING_BY_DEFAULT = tuple(name for name, p in PRESETS.items() if p.dynamic_sampling_default)
# TRL loss types (not preset names) whose gradient does not depend on which rows of an optimizer step share a
# micro-batch (equal-sized micro-batches): per-sequence means averaged (grpo, sapo), a constant (dr_grpo), or one
# normaliser over the whole step (dapo, cispo). bnpo divides by each micro-batch's own token count.
ORDER_NEUTRAL_LOSSES = tuple(dict.fromkeys(p.loss_type for p in PRESETS.values() if p.order_neutral))


def algorithm_names() -> tuple[str, ...]:
    """Every preset's name, in the registry's order."""
    return tuple(PRESETS)


def get_preset(name: str) -> Preset:
    """The preset called ``name``; a ValueError that lists the known names otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(PRESETS)}") from None


def algorithm_help() -> str:
    """The config's help for ``algorithm.name``: every preset with its one line."""
    items = [f"{p.name} ({p.help})" for p in PRESETS.values()]
    return f"{', '.join(items[:-1])} or {items[-1]}; see agentic_rag.training.algorithms"


def algorithm_args(name: str, *, epsilon: float | None = None, epsilon_high: float | None = None,
                   mask_truncated: bool | None = None, scale_rewards: str | None = None) -> dict[str, Any]:
    """GRPOConfig settings of each algorithm (through TRL's own options wherever they exist), with its paper's
    defaults; a setting given here (not None) replaces the preset's. The REINFORCE++ pair takes TRL's token-level
    aggregation (``loss_type="dapo"``: the sum over all model tokens of the global batch divided by their count)
    with the symmetric clip; their advantages are computed by the trainer
    (:func:`agentic_rag.training.reinforce_pp.reinforce_pp_advantages`), so ``scale_rewards`` does not apply."""
    p = get_preset(name)
    args: dict[str, Any] = {"importance_sampling_level": p.importance_sampling_level, "epsilon": p.epsilon,
                            "loss_type": p.loss_type, "scale_rewards": p.scale_rewards}
    if p.epsilon_high is not None:
        args["epsilon_high"] = p.epsilon_high
    if p.mask_truncated is not None:
        args["mask_truncated_completions"] = p.mask_truncated
    args.update(p.trl_options)
    if epsilon is not None:
        args["epsilon"] = epsilon
    if epsilon_high is not None:
        args["epsilon_high"] = epsilon_high
    if mask_truncated is not None:
        args["mask_truncated_completions"] = mask_truncated
    if scale_rewards is not None:
        if p.kl_in_return:
            raise ValueError(f"scale_rewards does not apply to {name}: the trainer whitens its advantages")
        args["scale_rewards"] = scale_rewards
    return args
