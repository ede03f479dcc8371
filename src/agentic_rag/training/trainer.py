"""AgenticGRPOTrainer: TRL's GRPOTrainer whose generation is the multi-turn, searching rollout engine.

What it optimises (stated plainly, as every RL recipe should):

* **Rollouts.** Each question is rolled out ``num_generations`` times by :class:`~agentic_rag.rollout.AgentRollout`
  with the current policy (base model + LoRA adapter): the model reasons, searches, reads and answers.
  Tokens the environment inserted (observations, notes, the end-of-sequence token closing a finished
  trajectory) have ``env_mask`` 0; tokens the model wrote have 1.
* **Reward.** The weighted sum of the configured reward functions (each also logged on its own).
* **Advantage and loss.** Those of the algorithm preset (``algorithm.name``): each preset, its formula and its paper
  are in :mod:`agentic_rag.training.algorithms`. The loss is PPO's clipped ratio
  ``min(rho * A, clip(rho, 1 - eps, 1 + eps_high) * A)`` per model token unless the preset replaces it (cispo,
  sapo), aggregated as the preset says. All but the REINFORCE++ pair give one advantage per completion from its
  group (``grpo``: ``(r - mean_group) / std_group``) and add ``beta * KL`` (k3) to the loss when ``beta > 0``;
  the REINFORCE++ pair (:mod:`agentic_rag.training.reinforce_pp`) gives one advantage per model token from
  KL-shaped returns, with no KL term in the loss, and logs its k1 ``kl`` from the return. With ``beta = 0`` (the
  default) no reference log-probabilities are computed and no ``kl`` is logged. The reference is the same model
  with the adapter disabled, or, when training goes on from an existing adapter (``model.adapter``), a frozen copy
  of that adapter as loaded (TRL's ``ref`` adapter). ``pi_old`` is the policy that generated the batch, scored by
  the trainer's own path (not the rollout's recorded values), so the KL is exactly 0 while the policy equals the
  reference. A completion every reward function calls not applicable gets advantage 0 (and, in the REINFORCE++
  pair, does not count in the mean and std).
* **Dynamic sampling** (DAPO's; :mod:`agentic_rag.training.dynamic_sampling`): zero-variance groups dropped and
  refilled with informative groups of further questions, every process keeping its batch size.
* **Micro-batches.** Each optimizer step's rows are dealt into micro-batches shortest first and each micro-batch is
  scored over its own used columns only (:mod:`agentic_rag.training.micro_batches`), for the losses whose gradient
  does not depend on which rows share a micro-batch (``ORDER_NEUTRAL_LOSSES``). On the quick start's real-model
  step (64 trajectories, micro-batch 16) this cut the scoring forward from 30 s to 18 s a step; the loss and
  gradient are unchanged (tests/test_trainer_scoring.py).
* **Masks.** The policy term and the KL term are multiplied by ``completion_mask * env_mask``: an
  environment token never contributes to the loss, the KL or the gradient.
* **Sampling.** The loss scores tokens with the full-softmax ``log_softmax(logits / temperature)``; top-p < 1,
  top-k, a repetition penalty or decoding processors make the samples off-policy (the config check and the
  trainer warn). FSDP, and ZeRO-3 without ``ds3_gather_for_generation``, are refused: processes decode different
  numbers of steps, which sharded weights cannot serve (:mod:`agentic_rag.training.launch_checks`).
* **Answer branching** (``algorithm.answer_branching``; :mod:`agentic_rag.rollout.branching`, which names the papers):
  a group is one greedy rollout of its question cut just after its answer tag, and ``num_generations`` answers
  sampled from there, not independent rollouts; the advantage compares the answers, and only the tokens after the
  branch point are in the loss (``Trajectory.trained_mask``). A trunk with no answer gives copies, nothing trained.
* **Contexts.** After a backtrack or summary, later tokens were generated without the abandoned text; such
  trajectories are scored with a tree-shaped 4D attention mask and their own position ids
  (:mod:`agentic_rag.training.tree`), so every token's log-probability is computed under exactly the context it
  was generated with. Every scoring pass (old, reference and current policy) gives every row its real position ids
  (the rollout's: 0 at the first prompt token, not shifted by left padding), so a row's log-probabilities do not
  depend on what shares its micro-batch. Only sdpa and eager apply the 4D mask, and it replaces a model's
  sliding-window mask: with a dialect whose backtrack or summary branches contexts, other attention kernels (flash
  attention) and models with a sliding window are refused before training (the config check refuses them before
  the model loads).
* **Checkpoints** are crash-safe (:mod:`agentic_rag.training.checkpoints`).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer
from trl.models import unwrap_model_for_generation

from ..data.prompts import build_prompt
from ..rollout import AgentRollout, HFPolicy, SamplingParams
from ..rollout.branching import answer_branches
from ..rollout.engine import as_registry, tool_schemas
from ..rollout.events import calls_by_tool, failures_by_tool
from ..rollout.settings import PromptSettings, RolloutSettings
from ..rollout.trained_settings import resolved_prompt, write_settings
from ..rollout.trajectory import ENV, MODEL, Trajectory, search_outcomes
from .algorithms import DEFAULT_ALGORITHM, ORDER_NEUTRAL_LOSSES, Preset, get_preset
from .checkpoints import rotate_checkpoints, write_marker
from .dynamic_sampling import informative_groups, refill_groups, select_rows
from .launch_checks import refuse_tree_masks_it_cannot_serve, refuse_unsupported_launch
from .micro_batches import group_by_length, used_columns
from .model import compact_lm_head_scoring
from .reinforce_pp import reinforce_pp_advantages
from .search_failures import SearchFailures
from .tree import TreeLayout, real_positions, tree_inputs

log = logging.getLogger(__name__)

# The one length cut: the global completion budget. A turn that ran out of tokens (turn_token_limit) without closing its
# tag ended the trajectory like any other limit: it is closed by an EOS, scored (usually 0) and trained on.
LENGTH_ENDINGS = ("max_completion_tokens",)
VALIDATION_ROWS = 128  # greedy validation's rows decoding at once (greedy_rollouts)


@dataclass
class AgentSettings:
    """How the trainer rolls out: tools, the rollout and prompt settings (the config's own objects), algorithm."""

    tools: Any
    settings: RolloutSettings
    prompt: PromptSettings
    algorithm: str
    max_batch_size: int | None
    processors: list  # decoding constraints for the rollout policy (see HFPolicy)
    shuffle_rewards: bool = False  # the shuffled-reward control (see _calculate_rewards)
    dynamic_sampling: bool = False  # drop zero-variance groups and refill (see _generate_and_score_completions)
    max_extra_rollouts: int = 0  # the refills' cap, rollouts per process per generation batch
    max_search_failure_rate: float = 0.05  # the run stops when more of its searches fail (.search_failures)
    search_timeout_s: float = 30.0  # one batch tool call
    answer_branching: bool = False  # a group is one greedy trunk's answers (see _branched_rollouts)
    tool_specs: list | None = None  # the tools: list the tools were built from (recorded with the adapter)


def save_trained_settings(agent: AgentSettings, tokenizer: Any, directory: str | os.PathLike) -> Path:
    """Write what a saved adapter must be served and evaluated with into ``directory``: the rollout settings and the
    prompt exactly as the rollouts built it (the system prompt written out, the chat template as the tokenizer
    resolved "when it has one")."""
    prompt = resolved_prompt(agent.prompt, agent.settings.dialect, tokenizer)
    return write_settings(directory, agent.settings, prompt, written_by="grpo", tools=agent.tool_specs)


class AgenticGRPOTrainer(GRPOTrainer):
    """GRPO over multi-turn, searching trajectories (see the module docstring for the exact objective)."""

    def __init__(self, model, *, tokenizer, reward_funcs, args: GRPOConfig, train_dataset, tools,
                 settings: RolloutSettings | None = None, prompt: PromptSettings | None = None,
                 algorithm: str = DEFAULT_ALGORITHM, max_batch_size: int | None = None, processors=(),
                 shuffle_rewards: bool = False, dynamic_sampling: bool | None = None,
                 max_extra_rollouts: int | None = None, max_search_failure_rate: float = 0.05,
                 search_timeout_s: float = 30.0, answer_branching: bool = False, peft_config=None, callbacks=None,
                 tool_specs: list | None = None):
        """``settings`` / ``prompt``: the config's ``rollout`` and ``prompt`` sections (defaults: a rollout within
        ``args.max_completion_length``), saved with every adapter."""
        preset = get_preset(algorithm)
        if dynamic_sampling is None:
            dynamic_sampling = preset.dynamic_sampling_default
        per_generation = args.per_device_train_batch_size * args.steps_per_generation
        if dynamic_sampling:
            if preset.kl_in_return:
                raise ValueError(f"dynamic sampling does not apply to {algorithm}: its advantages are normalised over "
                                 "the whole batch, not within groups")
            if per_generation % args.num_generations:
                raise ValueError(f"dynamic sampling drops and refills whole groups on each process: the rollouts a "
                                 f"process generates at once (per_device_train_batch_size x steps_per_generation = "
                                 f"{per_generation}) must be a multiple of num_generations ({args.num_generations})")
        if max_extra_rollouts is not None and max_extra_rollouts < 0:
            raise ValueError(f"max_extra_rollouts must be >= 0, got {max_extra_rollouts}")
        refuse_unsupported_launch(args)
        settings = settings or RolloutSettings(max_completion_tokens=args.max_completion_length or 1024)
        refuse_tree_masks_it_cannot_serve(model, settings.dialect, settings.summary_mode)
        if processors:
            log.warning("%d decoding processor(s) shape what the rollouts sample, but the loss scores tokens with "
                        "full-softmax log-probabilities: the samples are off-policy and the importance ratio (and "
                        "the KL) is biased. Pass no processors for on-policy training.", len(processors))
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        if args.max_completion_length and settings.max_completion_tokens > args.max_completion_length:
            raise ValueError(f"rollout max_completion_tokens ({settings.max_completion_tokens}) exceeds the "
                             f"trainer's max_completion_length ({args.max_completion_length})")
        # one attribute, so nothing collides with GRPOTrainer's own (it has a `tools` of its own, for one)
        self.agent = AgentSettings(tools=tools, settings=settings, prompt=prompt or PromptSettings(),
                                   algorithm=algorithm, max_batch_size=max_batch_size, processors=list(processors),
                                   shuffle_rewards=shuffle_rewards, dynamic_sampling=bool(dynamic_sampling),
                                   max_extra_rollouts=per_generation if max_extra_rollouts is None
                                   else max_extra_rollouts, max_search_failure_rate=max_search_failure_rate,
                                   search_timeout_s=search_timeout_s, answer_branching=answer_branching,
                                   tool_specs=tool_specs)
        self.search_failures = SearchFailures(max_search_failure_rate)  # over the run, all processes
        self._shuffle_step, self._shuffle_calls = -1, 0  # the shuffled-reward control's position (step, call)
        self._prompt_cache: dict[str, list[int]] = {}
        self._active_layouts: list[TreeLayout | None] | None = None
        self._active_env: list[list[int]] | torch.Tensor | None = None  # env_mask of the rows being scored
        self._active_rows: list[dict[str, Any]] | None = None  # the dataset rows being rolled out (_tool_rows)
        self._last_trajectories: list[Trajectory] = []
        self._rewards_per_func: torch.Tensor | None = None
        compact_lm_head_scoring()
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                         processing_class=tokenizer, peft_config=peft_config, rollout_func=self._rollout,
                         callbacks=callbacks)

    @property
    def preset(self) -> Preset:
        """The algorithm preset this trainer runs (:mod:`agentic_rag.training.algorithms`)."""
        return get_preset(self.agent.algorithm)

    # ------------------------------------------------------------------------------------------ rollouts

    def _prompt_ids(self, question: Any) -> list[int]:
        if not isinstance(question, str):
            raise TypeError("training prompts must be question strings (the 'prompt' column); the rollout "
                            "applies the dialect's system prompt and the chat template itself")
        ids = self._prompt_cache.get(question)
        if ids is None:
            a = self.agent
            ids = build_prompt(self.processing_class, question, a.settings.dialect, language=a.prompt.language,
                               chat=a.prompt.chat_template, system=a.prompt.system_prompt or None,
                               tools=tool_schemas(a.tools))
            self._prompt_cache[question] = ids
        return ids

    def greedy_rollouts(self, questions: list[str]) -> list[Trajectory]:
        """The current policy's greedy rollouts of ``questions`` (the training run's settings, prompt and tools):
        what evaluation would see of the adapter now. Every process rolls out the same questions (a collective
        decode under ZeRO-3 needs them all); the model is put back in training mode after. At most
        ``VALIDATION_ROWS`` decode together unless ``sampling.max_batch_size`` says fewer: the KV cache grows with
        the rows in flight (200 wiki validation questions at once took a 135M model's run from 4.6 to 7.8 GB; 64 at
        once took 411 s against 233 s on 2 cores, where a decode step's cost is mostly reading the weights)."""
        tok, args = self.processing_class, self.args
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                         gather_deepspeed3_params=args.ds3_gather_for_generation,
                                         gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs) as model:
            was_training = model.training
            model.eval()
            try:
                a = self.agent
                rows = min(a.max_batch_size or VALIDATION_ROWS, VALIDATION_ROWS)
                policy = HFPolicy(model, tok, SamplingParams(do_sample=False), max_batch_size=rows,
                                  return_logprobs=False)
                with AgentRollout(policy, tok, a.tools, a.settings, search_timeout_s=a.search_timeout_s) as engine:
                    return engine.run([self._prompt_ids(q) for q in questions], list(questions))
            finally:
                model.train(was_training)

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
            started = time.perf_counter()
            if a.answer_branching:
                trajs, searching, waiting = self._branched_rollouts(model, policy, prompts)
            else:
                with AgentRollout(policy, tok, a.tools, a.settings, search_timeout_s=a.search_timeout_s) as engine:
                    trajs = engine.run([self._prompt_ids(q) for q in prompts], [str(q) for q in prompts],
                                       rows=self._tool_rows(prompts))
                    searching, waiting = engine.tool_seconds
        # where a step's time goes (experiments/benchmarks/grpo_step_real.py): the rollout (decoding, and waiting
        # for searches where no decoding overlapped them), and the searches themselves
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["timing/rollout_s"].append(time.perf_counter() - started)
        self._metrics[mode]["timing/search_s"].append(searching)
        self._metrics[mode]["timing/search_wait_s"].append(waiting)
        eos = tok.eos_token_id
        for t in trajs:
            # A trajectory that ended on its own (answer, EOS, or a behavioural limit, turn_token_limit included) is
            # closed by an end-of-sequence token from the environment, so TRL counts only the completion budget as a
            # length cut (mask_truncated_completions). There is room: turn_token_limit leaves budget unspent.
            if t.finish_reason not in LENGTH_ENDINGS and (not t.completion_ids or t.completion_ids[-1] != eos):
                t.append([eos], ENV)
        self._last_trajectories = trajs
        self._active_layouts = [None if t.is_linear else TreeLayout(t) for t in trajs]
        self._active_env = trained = [t.trained_mask for t in trajs]
        self._log_rollouts(trajs)
        return {
            "prompt_ids": [t.prompt_ids for t in trajs],
            "completion_ids": [t.completion_ids for t in trajs],
            "logprobs": [t.logprobs for t in trajs] if all(t.logprobs is not None for t in trajs) else None,
            "env_mask": trained,
            "trajectory": [self._view(t) for t in trajs],
        }

    def _tool_rows(self, prompts: list[Any]) -> list[dict[str, Any]] | None:
        """Each rollout's question fields for its per-rollout tools' ``reset(**row)``, as evaluation gives them: the
        dataset row (answers, id, ...) with its question under ``question`` (None outside a scored batch)."""
        inputs = self._active_rows
        if inputs is None or len(inputs) != len(prompts):
            return None
        return [{"question": str(q), **{k: v for k, v in row.items() if k != "prompt"}}
                for q, row in zip(prompts, inputs, strict=True)]

    def _branched_rollouts(self, model: Any, policy: HFPolicy, prompts: list[Any]) -> tuple[list[Trajectory], float,
                                                                                          float]:
        """Answer branching (:mod:`agentic_rag.rollout.branching`): each group's question rolled out once, greedily
        (the trunk: what the policy searches and reads now, as validation sees it), then its ``num_generations``
        answers sampled by ``policy`` from just after the trunk's answer tag. Returns the branches in TRL's order
        (each group's rows together) and the seconds spent in and waiting for searches."""
        a, tok = self.agent, self.processing_class
        g = self.num_generations if self.model.training else self.num_generations_eval
        questions = prompts[::g]
        if [q for q in questions for _ in range(g)] != list(prompts):
            raise RuntimeError(f"answer branching needs each question's {g} rows together, as TRL's sampler "
                               "repeats them")
        greedy = HFPolicy(model, tok, SamplingParams(do_sample=False), max_batch_size=a.max_batch_size,
                          return_logprobs=policy.return_logprobs, processors=a.processors)
        with AgentRollout(greedy, tok, a.tools, a.settings, search_timeout_s=a.search_timeout_s) as engine:
            rows = self._tool_rows(prompts)
            trunks = engine.run([self._prompt_ids(q) for q in questions], [str(q) for q in questions],
                                rows=rows[::g] if rows is not None else None)
            searching, waiting = engine.tool_seconds
        with AgentRollout(policy, tok, a.tools, a.settings, search_timeout_s=a.search_timeout_s) as engine:
            groups = answer_branches(engine, trunks, g)
            more, more_waiting = engine.tool_seconds  # a branch that searches instead of answering
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["agentic/answer_branched_groups"].append(
            sum(group[0].branch_start < len(group[0].completion_ids) for group in groups) / max(1, len(groups)))
        return [t for group in groups for t in group], searching + more, waiting + more_waiting

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
        self.search_failures.add(failed, searches, self.state.global_step)  # stops a run on a broken search target
        reasons = Counter(t.finish_reason for t in trajs)
        for reason, n in reasons.items():
            self._metrics[mode][f"agentic/finish/{reason}"].append(n / len(trajs))
        others = [name for name in as_registry(self.agent.tools).names() if name != "search"]
        if others:  # every other tool's calls and failures, apart from the searches (the same names on every process)
            counts = [(calls_by_tool(t.events), failures_by_tool(t.events)) for t in trajs]
            per = torch.tensor([[c[n] for n in others] + [f[n] for n in others] for c, f in counts],
                               dtype=torch.float32, device=device)
            means = self.accelerator.gather(per).mean(0).tolist()
            for k, name in enumerate(others):
                self._metrics[mode][f"agentic/tools/{name}/calls_per_trajectory"].append(means[k])
                self._metrics[mode][f"agentic/tools/{name}/failures_per_trajectory"].append(means[len(others) + k])

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """Train as TRL does; a resumed run takes up the search counts its checkpoint recorded."""
        if isinstance(resume_from_checkpoint, str | os.PathLike):
            self.search_failures.load(resume_from_checkpoint)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    # ---------------------------------------------------------------------------------- advantages

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._log_mixed_groups(rewards)
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

    def _log_mixed_groups(self, rewards: torch.Tensor) -> None:
        """``agentic/<name>_mixed_groups``: the share of the batch's question groups whose first accuracy reward
        (em, f1...) differs among the group's rollouts, before any shuffling. TRL's ``frac_reward_zero_std`` looks at
        the total reward, where the format reward alone makes a group of all-wrong answers look informative; this is
        the share of questions the accuracy signal reaches."""
        from ..rewards.registry import accuracy_names

        acc = next((i for i, n in enumerate(self.reward_func_names) if n in accuracy_names()), None)
        g = self.num_generations if self.model.training else self.num_generations_eval
        if acc is None or not g or rewards.shape[0] % g:
            return
        grouped = rewards[:, acc].nan_to_num(0.0).view(-1, g)
        mixed = (grouped.max(dim=1).values != grouped.min(dim=1).values).float().mean()
        self._metrics["train" if self.model.training else "eval"][
            f"agentic/{self.reward_func_names[acc]}_mixed_groups"].append(float(mixed))

    def _generate_and_score_completions(self, inputs):
        output = self._score_batch(inputs)
        if self.agent.dynamic_sampling and self.model.training:
            output = self._refill_informative_groups(inputs, output)
        return output

    def _score_batch(self, inputs):
        """TRL's generation and scoring of ``inputs`` (the REINFORCE++ advantages where they apply), with each
        row's tree layout for the loss."""
        self._active_rows = inputs  # the rows of the prompts the rollout gets: their fields reach the tools
        try:
            output = super()._generate_and_score_completions(inputs)
            if self.preset.kl_in_return:  # while the rows' layouts are still set (old log-probs)
                output["advantages"] = self._reinforce_pp_output(output)
        finally:
            layouts, self._active_layouts = self._active_layouts, None
            self._active_env = self._active_rows = None
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
        """DAPO's dynamic sampling (:mod:`agentic_rag.training.dynamic_sampling`): the batch's zero-variance groups
        replaced by informative groups of further questions, as far as the cap allows; the same number of rows."""
        group, device = self.num_generations, self.accelerator.device

        def gather(values: list[float]) -> torch.Tensor:
            return self.accelerator.gather(torch.tensor([values], device=device, dtype=torch.float32)).view(
                -1, len(values))

        def score_more(groups: int, round_: int) -> tuple[dict[str, Any], list[bool]]:
            extra = self._score_batch(self._draw_groups(groups, round_))
            return extra, self._local_informative(groups * group)

        refill = refill_groups(output, self._local_informative(len(inputs)), group, score_more=score_more,
                               gather=gather, max_extra_rollouts=self.agent.max_extra_rollouts)
        merged = select_rows(refill.pieces, self.processing_class.pad_token_id)
        loss_mask = merged["completion_mask"] * merged.get("tool_mask", 1)
        merged["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        totals = gather([refill.drawn, refill.zero_variance, refill.filled, refill.rounds])
        metrics = self._metrics["train"]
        metrics["dynamic_sampling/extra_rollouts"].append(float(totals[:, 0].sum()))
        metrics["dynamic_sampling/zero_variance_groups"].append(float(totals[:, 1].sum()))
        metrics["dynamic_sampling/filled"].append(float(totals[:, 2].sum()))
        metrics["dynamic_sampling/rounds"].append(float(totals[:, 3].max()))
        return merged

    def _reinforce_pp_output(self, output: dict[str, Any]) -> torch.Tensor:
        """The REINFORCE++ advantages ``[B, T]`` of a scored generation batch (:mod:`.reinforce_pp`).

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
        """Per-token advantages ``[B, T]`` of this process's rows (:func:`reinforce_pp_advantages` with this run's
        ``beta`` and preset, the statistics over the model tokens of all processes)."""
        return reinforce_pp_advantages(rewards, mask, kl, group_size, beta=self.beta,
                                       group_baseline=self.preset.group_baseline,
                                       process_index=self.accelerator.process_index,
                                       reduce=lambda t: self.accelerator.reduce(t, reduction="sum"))

    # --------------------------------------------------------------------------------------- scoring

    def _compute_loss(self, model, inputs):
        self._active_layouts = inputs.get("agentic_layout")
        self._active_env = inputs.get("tool_mask")
        beta = self.beta
        if self.preset.kl_in_return:
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
                tree = tree_inputs(model, layouts[start:end], attention_mask[start:end], prompt_width,
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

    # ----------------------------------------------------------------------------------- checkpoints

    def _save_checkpoint(self, model, trial):
        """Save as TRL does, but crash-safe: rotation waits until the new checkpoint is complete.

        Transformers deletes old checkpoints (``save_total_limit``) at the end of its save, before we could mark
        the new one complete: a kill in between would leave no complete checkpoint at all with a limit of 1. So
        the save runs with rotation off; once every process has written its part the marker goes in, and only
        then are old checkpoints deleted, counting complete ones only (:func:`rotate_checkpoints`). The adapter's
        rollout settings (:func:`save_trained_settings`) are written into the checkpoint before its marker."""
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
            save_trained_settings(self.agent, self.processing_class, checkpoint)
            self.search_failures.save(checkpoint)
            write_marker(checkpoint)
            rotate_checkpoints(run_dir, limit, keep=self.state.best_model_checkpoint)

