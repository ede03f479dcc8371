"""AgenticGRPOTrainer: TRL's GRPOTrainer whose generation is the multi-turn, searching rollout engine.

What it optimises (stated plainly, as every RL recipe should):

* **Rollouts.** Each question is rolled out ``num_generations`` times by :class:`~agentic_rag.rollout.AgentRollout`
  with the current policy (base model + LoRA adapter): the model reasons, searches, reads and answers.
  Tokens the environment inserted (observations, notes, the end-of-sequence token closing a finished
  trajectory) have ``env_mask`` 0; tokens the model wrote have 1.
* **Reward.** The weighted sum of the configured reward functions (each also logged on its own).
* **Advantage.** ``grpo``: ``(r - mean_group) / std_group``; ``dr_grpo``: ``r - mean_group`` (no scaling);
  ``dapo``: as grpo, with the upper clip at 1.28 (clip-higher), token-level aggregation and length-truncated
  trajectories masked; DAPO's dynamic sampling (dropping groups whose rewards are all equal and sampling
  more) and its overlong reward shaping are **not** implemented: such groups stay in the batch with advantage
  0. ``reinforce_pp``: REINFORCE++-style ``(r - mean_batch) / std_batch`` over the whole (all-process) batch,
  no group baseline. A completion every reward function calls not applicable gets advantage 0.
* **Loss.** PPO-style clipped ratio ``min(rho * A, clip(rho, 1 - eps, 1 + eps_high) * A)`` per model token,
  plus ``beta * KL`` (the k3 estimator) to the reference policy when ``beta > 0``. With ``beta = 0`` (the
  default) no reference log-probabilities are computed and no ``kl`` is logged. The reference is the same
  model with the adapter disabled, or, when training goes on from an existing adapter (``model.adapter``),
  a frozen copy of that adapter as loaded (TRL's ``ref`` adapter). Aggregation: per sequence then mean
  (``grpo``), over all tokens of the global batch (``dapo``, ``reinforce_pp``), or by a constant (``dr_grpo``).
* **Masks.** The policy term and the KL term are multiplied by ``completion_mask * env_mask``: an
  environment token never contributes to the loss, the KL or the gradient.
* **Contexts.** After a backtrack or summary, later tokens were generated without the abandoned text; such
  trajectories are scored with a tree-shaped 4D attention mask and their own position ids, so every token's
  log-probability is computed under exactly the context it was generated with.
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

from ..data.prompts import build_prompt
from ..rollout import AgentRollout, HFPolicy, RolloutLimits, SamplingParams
from ..rollout.scoring import layout
from ..rollout.trajectory import ENV, MODEL, Trajectory
from .model import compact_lm_head_scoring

log = logging.getLogger(__name__)

ALGORITHMS = ("grpo", "dr_grpo", "dapo", "reinforce_pp")
LENGTH_ENDINGS = ("turn_token_limit", "max_completion_tokens")
COMPLETE_MARKER = ".complete"


def algorithm_args(name: str, *, epsilon_high: float | None = None,
                   mask_truncated: bool | None = None) -> dict[str, Any]:
    """GRPOConfig settings of each algorithm (through TRL's own options wherever they exist)."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    presets = {
        "grpo": {"loss_type": "grpo", "scale_rewards": "group"},
        "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
        "dapo": {"loss_type": "dapo", "scale_rewards": "group", "epsilon_high": 0.28,
                 "mask_truncated_completions": True},
        "reinforce_pp": {"loss_type": "dapo", "scale_rewards": "none"},
    }
    args = dict(presets[name])
    if epsilon_high is not None:
        args["epsilon_high"] = epsilon_high
    if mask_truncated is not None:
        args["mask_truncated_completions"] = mask_truncated
    return args


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


def linear_tensors(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same tensors for an ordinary row: causal over its real tokens."""
    n = attention_mask.shape[0]
    real = attention_mask.bool().cpu()
    positions = (torch.cumsum(real.long(), 0) - 1).clamp(min=0)
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool)) & real[None, :] & real[:, None]
    allowed |= torch.eye(n, dtype=torch.bool)
    return positions, allowed


class AgenticGRPOTrainer(GRPOTrainer):
    """GRPO over multi-turn, searching trajectories (see the module docstring for the exact objective)."""

    def __init__(self, model, *, tokenizer, reward_funcs, args: GRPOConfig, train_dataset, tools,
                 dialect: str = "agentic", limits: RolloutLimits | None = None, language: str = "en",
                 chat: bool | None = None, algorithm: str = "grpo", max_batch_size: int | None = None,
                 summary_mode: str = "replace", processors=(), system: str | None = None,
                 shuffle_rewards: bool = False, peft_config=None, callbacks=None):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        limits = limits or RolloutLimits(max_completion_tokens=args.max_completion_length or 1024)
        if args.max_completion_length and limits.max_completion_tokens > args.max_completion_length:
            raise ValueError(f"rollout max_completion_tokens ({limits.max_completion_tokens}) exceeds the "
                             f"trainer's max_completion_length ({args.max_completion_length})")
        # one attribute, so nothing collides with GRPOTrainer's own (it has a `tools` of its own, for one)
        self.agent = AgentSettings(tools=tools, dialect=dialect, limits=limits, language=language, chat=chat,
                                   algorithm=algorithm, max_batch_size=max_batch_size, summary_mode=summary_mode,
                                   processors=list(processors), system=system or None,
                                   shuffle_rewards=shuffle_rewards)
        self._shuffle_calls = 0
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
            # A trajectory that ended on its own (answer, EOS, or a behavioural limit) is closed by an
            # end-of-sequence token from the environment, so TRL counts only length cuts as truncated.
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
                               float(any(e["type"] == "error" for e in t.events))] for t in trajs],
                             dtype=torch.float32, device=device)
        gathered = self.accelerator.gather(stats).mean(0).tolist()
        names = ["searches_per_trajectory", "turns_per_trajectory", "model_tokens", "env_tokens_masked",
                 "branched_fraction", "answered_fraction", "tool_error_fraction"]
        for name, value in zip(names, gathered, strict=True):
            self._metrics[mode][f"agentic/{name}"].append(value)
        reasons = Counter(t.finish_reason for t in trajs)
        for reason, n in reasons.items():
            self._metrics[mode][f"agentic/finish/{reason}"].append(n / len(trajs))

    # ---------------------------------------------------------------------------------- advantages

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.agent.shuffle_rewards:
            # The control run: every completion gets the rewards of a random other completion of the batch
            # (all reward functions permuted together). The batch's reward distribution, and so every logged
            # reward mean, is unchanged; what is lost is which completion earned it. The permutation depends
            # only on the seed and the call count, so all processes apply the same one to the gathered rows.
            gen = torch.Generator().manual_seed(self.args.seed * 1_000_003 + self._shuffle_calls)
            self._shuffle_calls += 1
            rewards = rewards[torch.randperm(rewards.shape[0], generator=gen).to(rewards.device)]
        self._rewards_per_func = rewards
        return rewards

    def _generate_and_score_completions(self, inputs):
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            layouts, self._active_layouts = self._active_layouts, None
            self._active_env = None
        output["agentic_layout"] = layouts if layouts is not None else [None] * len(output["advantages"])
        if self.agent.algorithm == "reinforce_pp" and self._rewards_per_func is not None:
            weights = self.reward_weights.to(self._rewards_per_func.device)
            total = (self._rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
            unscorable = torch.isnan(self._rewards_per_func).all(dim=1)
            valid = total[~unscorable]
            std = valid.std() if valid.numel() > 1 else torch.tensor(0.0, device=total.device)
            adv = (total - valid.mean()) / (std + 1e-4) if valid.numel() else torch.zeros_like(total)
            adv[unscorable] = 0.0
            n = len(output["advantages"])
            start = self.accelerator.process_index * n
            output["advantages"] = adv[start:start + n].to(output["advantages"].device)
        return output

    # --------------------------------------------------------------------------------------- scoring

    def _compute_loss(self, model, inputs):
        self._active_layouts = inputs.get("agentic_layout")
        self._active_env = inputs.get("tool_mask")
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._active_layouts, self._active_env = None, None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        """TRL's scoring, with two differences. Branched trajectories (backtrack, summary) get a tree-shaped 4D
        mask and their own position ids. And environment tokens are not scored: their labels are -100, so the
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
            ids, mask = input_ids[start:end], attention_mask[start:end]
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :-logits_to_keep] = -100
            if env is not None:
                labels[:, -logits_to_keep:] = labels[:, -logits_to_keep:].masked_fill(env[start:end] == 0, -100)
            kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
            if layouts is not None and any(layouts[start:end]):
                kwargs.update(self._tree_inputs(model, layouts[start:end], attention_mask[start:end], prompt_width,
                                                logits_to_keep))
            if compute_aux_loss:
                kwargs["output_router_logits"] = True
            with self.accelerator.autocast():
                out = model(**kwargs, labels=labels, fused_lm_head=True)
            all_logps.append(out.log_probs[:, -logits_to_keep:])
            if compute_entropy:
                all_entropies.append(out.entropy[:, -logits_to_keep:])
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
        then are old checkpoints deleted, counting complete ones only (:func:`rotate_checkpoints`)."""
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
            write_marker(run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
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
