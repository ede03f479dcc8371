"""The quick start: the whole product on the embedded default task, and proof that GRPO is what helps.

    python -m agentic_rag.demo.quickstart --out outputs/quickstart [--seeds 3] [--world-seed N] [--tiny]

(``script/quickstart.sh`` sets up the environment and runs this.) By default the policy is a real pretrained
model, SmolLM2-135M-Instruct (the packaged GGUF, ``smollm2-135m-instruct``), prompted through its ChatML
template; ``--tiny`` runs the same pipeline on a tiny Qwen2 model made from scratch with a word-level
tokenizer (a minute or two). The steps, each skipped when its output is already complete, so a second run
(or one after a crash) goes on where the last one stopped:

1. generate the fictional world (:mod:`agentic_rag.data.world`, ``--world-seed``) and build its BM25 index;
2. the model: the real one is only checked to be installed; ``--tiny`` makes its tokenizer and model
   (:mod:`agentic_rag.demo.tiny`);
3. the prompted model (real model only): the base model with the dialect's full instructions and no
   fine-tuning, evaluated on the held-out questions - the baseline every fine-tuned row is compared with;
4. SFT warm start on scripted expert trajectories (:mod:`agentic_rag.demo.experts`): every one-hop
   question answered from one search; two-hop questions mostly by a shortcut, sometimes by two searches
   (a LoRA adapter on the real model; every weight of the tiny one);
5. measure the SFT model on the held-out questions: greedy EM, and how sampled rollouts behave on two-hop
   questions (how often they already search twice, the policy's entropy) - what GRPO has to work with;
6. for each seed, GRPO from the SFT model (LoRA, exact-match + format reward, search mid-rollout), and
   the control: the same run with the rewards shuffled within each batch;
7. evaluate every run on the held-out questions, print the table, write ``summary.json``,
   ``reward_curve.png`` and one SwanLab dashboard with every run (``swanlab watch OUT/swanlog``).

The real model's training runs go one at a time, each with every core (a run on 2 threads steps about twice as
fast as on 1, and the control's longer trajectories would leave one core idle at the end of side-by-side runs);
the tiny model's runs, too small to use 2 threads, go two at a time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..argtypes import Parser, positive_float, positive_int
from ..errors import guarded
from ..logs import configure_logging
from ..training.machine import CPU_AUTOCAST
from .console import eval_progress, run_logged
from .report import (
    _mean,
    dashboard,
    plot,
    reward_curve,
    row,
    table,
    training_curves,  # noqa: F401 - experiments read it from here
)

log = logging.getLogger("agentic_rag.quickstart")

# the training recipes ship as package data (experiments/training/ links to them), so an installed package runs too
CONFIGS = Path(__file__).resolve().parents[1] / "resources" / "configs"
TINY_CONFIG = CONFIGS / "world_grpo.yaml"
REAL_CONFIG = CONFIGS / "world_grpo_smollm2.yaml"
REAL_MODEL = "smollm2-135m-instruct"
SYSTEM_PROMPT = "Answer the question by searching."
# as in both training configs (em 1.0, format 0.2), with evaluation's well_formed standing in for the format reward
JVM_HEAP = "1g"  # the world's index is a few hundred passages; Lucene's default 4 GB heap is for Wikipedia
SFT_BATCHES = ("random", "by_length")
# Settings.native_recipe: 16 questions x 4 rollouts a step (the config's micro-batch of 4 x 16), twice the tag recipe's
NATIVE_GRPO = {"algorithm.learning_rate": 1e-4, "algorithm.warmup_ratio": 0.3,
               "algorithm.gradient_accumulation_steps": 16, "algorithm.max_steps": 16}
# the native SFT mix: at 0.25 its start sampled two searches in 40% of two-hop rollouts and a shuffled-reward control
# drifted to them; at 0.15 (14%) with 16 steps each GRPO seed learned and no control did (Settings.native_recipe)
TWO_HOP_CORRECT = {"agentic": 0.25, "native": 0.15}


def native_room(rollout) -> dict[str, int]:
    """The rollout limits of the native format: it spells a call as JSON (about 25 tokens in SmolLM2's vocabulary,
    against 8 for a search tag) and its results come in the chat template's tool turn (about 12 tokens of wrapper), so
    each turn gets 24 more tokens and the trajectory 30 more a turn (the world task: 24 -> 48 and 200 -> 320)."""
    return {"max_tokens_per_turn": rollout.max_tokens_per_turn + 24,
            "max_completion_tokens": rollout.max_completion_tokens + 30 * rollout.max_turns}


@dataclass
class Settings:
    out: Path
    seeds: list[int]
    world_seed: int = 0
    tiny: bool = False  # the tiny from-scratch model instead of SmolLM2-135M-Instruct
    model: str = REAL_MODEL
    two_hop_correct: float | None = None  # two-hop expert trajectories that search twice; None: TWO_HOP_CORRECT
    sft_examples: int | None = 400  # expert trajectories drawn (seeded) for SFT; None: all of them
    sft_epochs: float = 1
    sft_learning_rate: float = 5e-4
    # the real model's SFT batches, one of SFT_BATCHES: batched by length the long (two-search) trajectories weigh
    # less in TRL's per-batch token mean, and the SFT model seldom searches twice (experiments/real_model/README.md,
    # "The SFT's batching"); the tiny model's SFT is always random
    sft_batches: str = "random"
    grpo_steps: int | None = None  # None: the config's
    workers: int = 1  # training runs at a time; the tiny model's default is 2
    behaviour_samples: int = 4  # sampled rollouts per held-out two-hop question
    move_aside: bool = False  # an --out folder that is not this quick start's is renamed aside instead of refused
    dialect: str = "agentic"  # the format the model searches in: a tag dialect, or native (its chat template's tools)

    def __post_init__(self) -> None:
        if self.two_hop_correct is None:
            self.two_hop_correct = TWO_HOP_CORRECT["native" if self.native_real_model else "agentic"]
        if self.sft_batches not in SFT_BATCHES:
            raise ValueError(f"sft_batches must be one of {SFT_BATCHES}, got {self.sft_batches!r}")

    @classmethod
    def for_tiny(cls, **kw: Any) -> Settings:
        """The tiny model's recipe: every weight fine-tuned, for 10 epochs over all the expert data."""
        kw.setdefault("workers", 2)
        return cls(tiny=True, model="", sft_examples=None, sft_epochs=10, sft_learning_rate=1e-3, **kw)

    @classmethod
    def from_dir(cls, made: Path, **overrides: Any) -> Settings:
        """The settings the quick start in ``made`` was run with (its ``settings.json``, as ``check_settings`` wrote
        it), for a script that trains or evaluates more from it; ``overrides`` on top (``out``, ``seeds``,
        ``workers``, ...; ``out`` defaults to ``made``, ``seeds`` to [0])."""
        path = Path(made) / "settings.json"
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"{made} is not a finished quick start's output: {path} is unreadable ({e})") from None
        if saved.get("task", "world") != "world":  # the wiki task's settings are WikiSettings' (demo/wiki.py)
            raise SystemExit(f"{made} is a quick start of the {saved['task']} task, not of the world task")
        known = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {"out": Path(made), "seeds": [0], **{k: v for k, v in saved.items() if k in known}}
        return cls(**{**kw, **overrides})

    @property
    def train_config(self) -> Path:
        return TINY_CONFIG if self.tiny else REAL_CONFIG

    @property
    def native_recipe(self) -> dict[str, Any]:
        """GRPO settings of the native format over the config's (the real model): the config's rate, 3e-4 from the
        first update, collapsed it (every rollout searched to the limit and never answered after one step); 1e-4 with a
        30% warm-up learned in 1 seed of 3 at 8 questions a step, the others falling back on the one-search shortcut;
        at 16 questions a step (less noise in each update, twice the step's time) seeds 1 and 2 learned too
        (experiments/quickstart/README.md, "Native format"). 4 questions x 8 rollouts did not help. From that SFT
        start a shuffled-reward control also drifted to two searches; from the 0.15 mix (TWO_HOP_CORRECT) no control
        did, and 16 steps, against the config's 10, let the third GRPO seed learn too."""
        return NATIVE_GRPO if self.native_real_model else {}

    @property
    def native_real_model(self) -> bool:
        """The native format's own recipe applies (the tiny model has no chat template, so never native)."""
        return self.dialect == "native" and not self.tiny

    @property
    def train_file(self) -> Path:
        return self.out / "world" / "train.jsonl"

    @property
    def index_dir(self) -> Path:
        return self.out / "index"

    @property
    def chat(self) -> bool:
        """The real model is an instruct model: its prompts go through its chat template."""
        return not self.tiny


# ------------------------------------------------------------------------------------------- helpers

def _done(path: Path) -> bool:
    return path.exists()


def _step(title: str) -> float:
    print(f"== {title}", flush=True)
    return time.perf_counter()


def _rollout(s: Settings):
    """The training config's rollout settings, so the SFT data, its adapter, training and evaluation all run with
    the very same ones."""
    from ..training.config import load_config

    rollout = load_config(s.train_config, env={}, check_files=False).rollout
    return dataclasses.replace(rollout, dialect=s.dialect, **(native_room(rollout) if s.dialect == "native" else {}))


def _prompt(s: Settings, system_prompt: str | None = SYSTEM_PROMPT):
    """The quick start's prompt: its short system prompt (None: the dialect's full instructions), the chat template
    for the real model."""
    from ..rollout.settings import PromptSettings

    return PromptSettings(system_prompt=system_prompt or "", chat_template=s.chat)


# ---------------------------------------------------------------------------------------------- steps

def build_task(s: Settings) -> dict[str, str]:
    from ..data.world import write_world
    from ..search.build import build_index

    paths = write_world(s.out / "world", seed=s.world_seed)
    build_index(paths["corpus"], s.out / "index", bm25=True, progress=False)
    return paths


def task_texts(world) -> list[str]:
    """Everything the task will show the model, for the tokenizer's vocabulary: passages, questions, the
    prompt, the observation format and the dialect's tags."""
    from ..data.world import questions
    from ..rollout.protocol import get_dialect

    train, test = questions(world)
    d = get_dialect("agentic")
    texts = [f"{p['title']} {p['text']}" for p in world.passages()]
    texts += [q["question"] for q in train + test]
    texts += [SYSTEM_PROMPT, "User: Assistant:", "(1) No new results.", "In which town is the based?"]
    texts += [t for tag in d.tool_tags for t in (tag.open, tag.close)]
    return texts


def prepare_model(s: Settings, texts: Callable[[], list[str]], seed: int) -> str:
    """The real model: resolved (a clear error with the install command when it is missing). ``--tiny``: its
    tokenizer (trained on ``texts()``, everything the task will show the model) and the randomly initialised
    model, made once under ``OUT/init``."""
    from .tiny import build_word_tokenizer, init_tiny_model

    if not s.tiny:
        from ..models import resolve_model

        resolve_model(s.model)
        return s.model
    init = s.out / "init"
    if _done(init / "config.json"):
        return str(init)
    tok = build_word_tokenizer(texts(), s.out / "tokenizer")
    return str(init_tiny_model(tok, init, seed=seed))


def build_model(s: Settings) -> str:
    from ..data.world import generate_world

    return prepare_model(s, lambda: task_texts(generate_world(s.world_seed)), s.world_seed)


def prompt_builder(tokenizer, s: Settings):
    from ..data.prompts import build_prompt
    from ..tools.base import SearchTool, schema

    tools = [schema(SearchTool(None))]  # the quick start's one tool (listed by the chat template in native)
    return lambda question: build_prompt(tokenizer, question, s.dialect, chat=s.chat, system=SYSTEM_PROMPT,
                                         tools=tools)


def sft(s: Settings, init: str) -> Path:
    from ..data.world import generate_world, questions
    from ..models import load_tokenizer
    from ..search import open_searcher
    from ..training.sft import run_sft
    from .experts import expert_questions, write_expert_trajectories

    out = s.out / "sft"
    if _done(out / "sft_summary.json"):
        return out
    world = generate_world(s.world_seed)
    train, _ = questions(world)
    people = sorted({q["supporting_facts"][0] for q in train})
    rows = expert_questions(world, people, two_hop_correct=s.two_hop_correct, seed=s.world_seed, dialect=s.dialect)
    if s.sft_examples is not None and s.sft_examples < len(rows):
        rows = random.Random(s.world_seed).sample(rows, s.sft_examples)
    tok = load_tokenizer(init)
    info = write_expert_trajectories(rows, s.out / "sft_data.jsonl", tokenizer=tok,
                                     searcher=open_searcher(s.out / "index"), prompt_ids=prompt_builder(tok, s),
                                     settings=_rollout(s))
    if info["not_ending_as_scripted"] or (s.tiny and info["unknown_tokens"]):
        raise RuntimeError(f"expert trajectories are not what the scripts say: {info}")
    print(f"   {info['trajectories']} expert trajectories: {info['by_kind']}", flush=True)
    if s.tiny:  # every weight of the tiny model, saved as a model directory
        summary = run_sft(model=init, data=str(s.out / "sft_data.jsonl"), output_dir=str(out), rollout=_rollout(s),
                          prompt=_prompt(s), full=True, epochs=s.sft_epochs, learning_rate=s.sft_learning_rate,
                          batch_size=16, seed=s.world_seed, logging_steps=100, resume=None)
    else:  # a LoRA adapter on the real model, which GRPO goes on training (model.adapter)
        summary = run_sft(model=init, data=str(s.out / "sft_data.jsonl"), output_dir=str(out), rollout=_rollout(s),
                          prompt=_prompt(s), epochs=s.sft_epochs, learning_rate=s.sft_learning_rate, batch_size=8,
                          lora_r=16, lora_alpha=32, seed=s.world_seed, logging_steps=10,
                          gradient_checkpointing=False, group_by_length=s.sft_batches == "by_length", resume=None)
    summary["expert_trajectories"] = info
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=1))
    return out


def models_of(s: Settings, sft_dir: Path) -> tuple[str, str]:
    """(base model, adapter of the SFT start): the real model carries the SFT as a LoRA adapter; the tiny
    one's SFT is a whole model directory."""
    return (str(sft_dir), "") if s.tiny else (s.model, str(sft_dir))


def evaluate(s: Settings, name: str, model: str, adapter: Path | str | None, *,
             system_prompt: str | None = SYSTEM_PROMPT, samples: int = 1) -> dict[str, Any]:
    """Evaluation on the held-out questions (the evaluation runner, resumable): greedy, or ``samples`` rollouts a
    question at temperature 1 (the summary's ``samples``: pass@n, mean over samples). ``system_prompt=None``: the
    dialect's full instructions (the prompted model's)."""
    from ..evaluation.config import DatasetSection, EvalConfig, PolicySection
    from ..evaluation.runner import run_evaluation
    from ..rollout.settings import SamplingSettings
    from ..search.settings import SearchSettings

    out = s.out / "eval" / name
    if _done(out / "summary.json"):
        return json.loads((out / "summary.json").read_text())
    cfg = EvalConfig(
        name=name, dataset=DatasetSection(path=str(s.out / "world" / "test.jsonl")),
        policy=PolicySection(type="local", model=str(model), adapter=str(adapter or ""), tokenizer=str(model),
                             device="cpu"),
        search=SearchSettings(index=str(s.out / "index")), rollout=_rollout(s), prompt=_prompt(s, system_prompt),
        samples=samples, sampling=SamplingSettings(temperature=1.0 if samples > 1 else 0.0),
        batch_size=max(1, 64 // samples), metrics=["em", "f1", "well_formed"], output_dir=str(out), seed=0)
    return run_evaluation(cfg, progress=False, overwrite=True, on_batch=eval_progress(name, cfg.dataset.path))


def model_token_entropy(model, trajs) -> float:
    """Mean entropy (nats) of the policy's next-token distribution at the tokens the model wrote, over
    linear trajectories: how much exploration GRPO's samples have left."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for t in trajs:
            if not t.is_linear or not t.completion_ids:
                continue
            ids = torch.tensor([t.prompt_ids + t.completion_ids])
            logits = model(input_ids=ids).logits[0, len(t.prompt_ids) - 1:-1].float()
            ent = -(logits.log_softmax(-1).exp() * logits.log_softmax(-1)).sum(-1)
            mask = torch.tensor(t.env_mask, dtype=torch.bool)
            total += float(ent[mask].sum())
            count += int(mask.sum())
    return total / max(1, count)


def sample_two_hop(s: Settings, policy_model, tok, two_hop: Sequence[dict[str, Any]], samples: int,
                   temperature: float = 1.0) -> tuple[dict[str, Any], list]:
    """``samples`` sampled rollouts of each two-hop question with the quick start's prompt and rollout limits: the
    share that search twice, that are right (overall and when searching twice), of questions with a right
    sample, searches per rollout and the entropy of the model's tokens; and the trajectories."""
    from ..rewards.accuracy import exact_match
    from ..rollout import AgentRollout, HFPolicy, SamplingParams
    from ..search import open_searcher

    asked = [q for q in two_hop for _ in range(samples)]
    engine = AgentRollout(HFPolicy(policy_model, tok, SamplingParams(temperature=temperature)), tok,
                          open_searcher(s.out / "index"), _rollout(s))
    build = prompt_builder(tok, s)
    trajs = engine.run([build(q["question"]) for q in asked], [q["question"] for q in asked])
    twice = [t.num_searches >= 2 for t in trajs]
    right = [exact_match(t.answer, [q["answer"]]) if t.answer is not None else 0.0
             for q, t in zip(asked, trajs, strict=True)]
    return {"questions": len(two_hop), "samples_per_question": samples,
            "two_searches_rate": sum(twice) / len(trajs),
            "em_sampled": sum(right) / len(trajs),
            "em_when_two_searches": (sum(r for r, t in zip(right, twice, strict=True) if t) / sum(twice))
            if any(twice) else None,
            "questions_with_a_right_sample": sum(any(right[i * samples:(i + 1) * samples])
                                                 for i in range(len(two_hop))) / max(1, len(two_hop)),
            "searches_per_rollout": sum(t.num_searches for t in trajs) / len(trajs),
            "entropy_model_tokens": model_token_entropy(policy_model, trajs)}, trajs


def sampled_behaviour(s: Settings, model: str, adapter: str) -> dict[str, Any]:
    """How the SFT model behaves when sampling (temperature 1, as GRPO rolls out) on held-out two-hop
    questions: how often it searches twice, how often it is then right, and its entropy (:func:`sample_two_hop`)."""
    import torch

    from ..data.world import generate_world, questions
    from ..models import load_causal_lm, load_tokenizer

    path = s.out / "eval" / "sft_sampled_behaviour.json"
    if _done(path):
        return json.loads(path.read_text())
    torch.manual_seed(0)
    _, test = questions(generate_world(s.world_seed))
    tok = load_tokenizer(model)
    policy_model = load_causal_lm(model, adapter=adapter or None, device="cpu")
    out, _ = sample_two_hop(s, policy_model, tok, [q for q in test if q["hops"] == 2], s.behaviour_samples)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


def grpo(s: Settings, sft_dir: Path, seed: int, control: bool) -> Path:
    """One GRPO run (or its shuffled-reward control) in its own process; returns its output directory."""
    name = f"seed{seed}-{'control' if control else 'grpo'}"
    return train_run(s, sft_dir, name, seed, {"algorithm.shuffle_rewards": str(control).lower()})


def train_run(s: Settings, sft_dir: Path, name: str, seed: int, overrides: dict[str, Any] | None = None,
              runs_dir: Path | None = None) -> Path:
    """One training run of the quick start's recipe from its SFT start, in its own process (the machine's cores
    shared among the runs that train at once), with ``overrides`` (``--set`` settings: another algorithm, for
    one) on top; skipped when its output directory already holds a finished run. Returns that directory,
    ``runs_dir/name`` (default ``OUT/runs/name``)."""
    out = (runs_dir or s.out / "runs") / name
    if _done(out / "train_summary.json") and _done(out / "final" / "adapter_config.json"):
        return out
    base, adapter = models_of(s, sft_dir)
    sets = {"model.name_or_path": base, "model.tokenizer": base, "data.train_file": s.train_file,
            "prompt.system_prompt": SYSTEM_PROMPT, "search.index": s.index_dir, "checkpoint.output_dir": out,
            "rollout.dialect": s.dialect,
            "seed": seed, "algorithm.shuffle_rewards": "false", "logging.run_name": name, **s.native_recipe,
            **(overrides or {})}
    # the real model carries its SFT as an adapter; the tiny model's SFT is a whole model directory whose word-level
    # tokenizer has no chat template, so a config that names an adapter (the wiki task's) must not apply one
    sets.update({"model.adapter": adapter} if adapter else {"model.adapter": "", "prompt.chat_template": "false"})
    if s.dialect == "native":
        from ..training.config import load_config

        room = native_room(load_config(s.train_config, env={}, check_files=False).rollout)
        sets.update({f"rollout.{k}": v for k, v in room.items()})
    # each run logs to its own OUTPUT_DIR/swanlog: SwanLab's local store takes one writer at a time, and two
    # runs train at once; dashboard() gathers them into one afterwards
    if s.grpo_steps:
        sets["algorithm.max_steps"] = s.grpo_steps
    cmd = [sys.executable, "-m", "agentic_rag.training.train", "--config", str(s.train_config), "--log-level",
           "WARNING"]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    threads = str(max(1, cores // s.workers))
    from ..malloc import child_env
    from ..outputs import mark_dir
    from ..search.jvm import default_heap
    from ..training.checkpoints import latest_complete_checkpoint

    # glibc's huge pages for the training process's large blocks (agentic_rag.malloc)
    env = child_env(dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false"))
    default_heap(env, JVM_HEAP)
    mark_dir(out, "train")
    if latest_complete_checkpoint(out, quarantine=False):
        cmd.append("--resume")  # an interrupted run goes on from its last checkpoint
    started = time.perf_counter()
    returncode = run_logged(cmd, env, out / "train.log", name)
    if returncode != 0:
        tail = (out / "train.log").read_text()[-3000:]
        raise RuntimeError(f"GRPO run {name} failed (exit {returncode}); the end of {out / 'train.log'}:\n{tail}")
    rewards = reward_curve(out)
    print(f"   {name}: {len(rewards)} steps in {time.perf_counter() - started:.0f} s, reward "
          f"{_mean(rewards[:5]):.3f} (first 5 steps) -> {_mean(rewards[-5:]):.3f} (last 5)", flush=True)
    return out


# ----------------------------------------------------------------------------------------------- main

def dialect_choices() -> tuple[str, ...]:
    from ..rollout.protocol import DIALECTS

    return tuple(DIALECTS)


def check_settings(s: Settings, extra: dict[str, Any] | None = None) -> None:
    """Steps whose output exists are skipped, so an output directory must not mix settings: refuse to go on
    in one made with other settings (adding seeds is fine). ``extra``: another task's own settings."""
    import hashlib

    mine = {"world_seed": s.world_seed, "tiny": s.tiny, "model": s.model, "two_hop_correct": s.two_hop_correct,
            "sft_examples": s.sft_examples, "sft_epochs": s.sft_epochs, "sft_learning_rate": s.sft_learning_rate,
            "sft_batches": s.sft_batches, "grpo_steps": s.grpo_steps,
            "train_config_sha256": hashlib.sha256(s.train_config.read_bytes()).hexdigest(), **(extra or {})}
    if s.dialect != "agentic":  # (earlier quick starts, all in the agentic dialect, recorded none)
        mine["dialect"] = s.dialect
    if s.native_recipe:
        mine["native_recipe"] = s.native_recipe
    from ..outputs import aside_path, claim_dir, mark_dir

    claim_dir(s.out, "quickstart", move_aside=s.move_aside)
    path = s.out / "settings.json"
    if path.exists():
        try:
            theirs = json.loads(path.read_text())
        except (OSError, ValueError):
            theirs = {"unreadable": True}  # damaged: it cannot vouch for the steps done, so it differs
        theirs = theirs if isinstance(theirs, dict) else {"unreadable": True}
        diff = sorted(k for k in mine if theirs.get(k) != mine[k])
        if diff and s.move_aside:
            moved = aside_path(s.out)
            os.replace(s.out, moved)
            log.warning("%s held a quick start made with other settings (%s differ): moved it to %s", s.out,
                        ", ".join(diff), moved)
        elif diff:
            raise SystemExit(f"{s.out} holds a quick start made with other settings ({', '.join(diff)} differ): "
                             f"pass another --out, or --move-aside to keep it as {s.out.name}.moved-TIME and "
                             f"start over")
    mark_dir(s.out, "quickstart")
    path.write_text(json.dumps(mine, indent=1))


def run(s: Settings) -> dict[str, Any]:
    from ..search.jvm import default_heap
    from ..training.monitoring import watch_hint

    default_heap(os.environ, JVM_HEAP)
    check_settings(s)
    t = _step(f"1. the fictional world (seed {s.world_seed}) and its BM25 index")
    paths = build_task(s)
    n_train = sum(1 for _ in open(paths["train"]))
    n_test = sum(1 for _ in open(paths["test"]))
    print(f"   {n_train} training and {n_test} held-out questions ({time.perf_counter() - t:.0f} s)")
    if s.tiny:
        t = _step("2. a word-level tokenizer and a tiny Qwen2 model, from scratch")
    else:
        t = _step(f"2. the model: {s.model}")
    init = build_model(s)
    prompted = None
    if not s.tiny:
        t = _step("3. the prompted model (no fine-tuning, the dialect's full instructions) on the held-out questions")
        prompted = evaluate(s, "prompted", s.model, None, system_prompt=None)
        print(f"   greedy EM {prompted['metrics']['em']:.3f}, searches per question "
              f"{prompted['searches_per_question']:.2f} ({time.perf_counter() - t:.0f} s)")
    t = _step("4. SFT warm start on scripted expert trajectories")
    sft_dir = sft(s, init)
    print(f"   ({time.perf_counter() - t:.0f} s)")
    t = _step("5. the SFT model on the held-out questions")
    base, sft_adapter = models_of(s, sft_dir)
    before = evaluate(s, "sft", base, sft_adapter)
    behaviour = sampled_behaviour(s, base, sft_adapter)
    print(f"   greedy EM {before['metrics']['em']:.3f}; sampled on two-hop questions: searches twice in "
          f"{behaviour['two_searches_rate']:.0%} of rollouts, right in {behaviour['em_sampled']:.0%}, entropy "
          f"{behaviour['entropy_model_tokens']:.3f} nats/token ({time.perf_counter() - t:.0f} s)")
    t = _step(f"6. GRPO with search mid-rollout, and the shuffled-reward control, seeds {s.seeds} "
              f"({s.workers} at a time)")
    jobs = [(seed, control) for seed in s.seeds for control in (False, True)]
    with ThreadPoolExecutor(max_workers=s.workers) as pool:
        dirs = dict(zip(jobs, pool.map(lambda j: grpo(s, sft_dir, *j), jobs), strict=True))
    print(f"   ({time.perf_counter() - t:.0f} s)")
    t = _step("7. evaluation on the held-out questions")
    results: dict[tuple[int, bool], dict[str, Any]] = {}
    for (seed, control), d in dirs.items():
        results[seed, control] = evaluate(s, d.name, base, d / "final")
    rows = [row("prompted (no SFT)", prompted)] if prompted else []
    rows.append(row("SFT (before)", before))
    for seed in s.seeds:
        rows.append(row(f"GRPO seed {seed}", results[seed, False]))
        rows.append(row(f"control seed {seed}", results[seed, True]))
    print(table(rows))
    names = {(seed, c): f"{'control' if c else 'GRPO'} seed {seed}" for seed, c in jobs}
    curves = {names[j]: reward_curve(dirs[j]) for j in jobs}
    plot(curves, s.out / "reward_curve.png")
    log_dir = dashboard(s.out, {names[j]: dirs[j] for j in jobs})
    em_before = before["metrics"]["em"]
    summary = {
        "seeds": s.seeds,
        "em_prompted": prompted["metrics"]["em"] if prompted else None,
        "em_before": [em_before] * len(s.seeds),
        "em_after": [results[seed, False]["metrics"]["em"] for seed in s.seeds],
        "em_control": [results[seed, True]["metrics"]["em"] for seed in s.seeds],
        "table": rows,
        "sft_sampled_two_hop": behaviour,
        "reward_first5_last5": {k: [_mean(v[:5]), _mean(v[-5:])] for k, v in curves.items()},
        "training_curves": {names[j]: training_curves(dirs[j]) for j in jobs},
        "held_out_questions": n_test,
        "settings": {"world_seed": s.world_seed, "model": s.model or "tiny", "two_hop_correct": s.two_hop_correct,
                     "sft_examples": s.sft_examples, "sft_epochs": s.sft_epochs,
                     "sft_learning_rate": s.sft_learning_rate, "sft_batches": s.sft_batches,
                     "grpo_config": s.train_config.name,
                     "grpo_steps": len(next(iter(curves.values())))},
        "reward_curve": str(s.out / "reward_curve.png"),
        "swanlab_log_dir": str(log_dir),
    }
    (s.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    gains = [a - em_before for a in summary["em_after"]]
    print(f"EM gain of GRPO over SFT per seed: {', '.join(f'{g:+.3f}' for g in gains)}; of the control: "
          f"{', '.join(f'{c - em_before:+.3f}' for c in summary['em_control'])}")
    print(f"reward curve: {s.out / 'reward_curve.png'}")
    from .results import render

    report = render(s.out)  # the plots and the paired claims with their intervals (agentic-rag report)
    print(f"report: {s.out / 'report.md'} (plots: {', '.join(Path(p).name for p in report['plots'])})")
    print(watch_hint(str(log_dir)))
    print(f"summary: {s.out / 'summary.json'}")
    return summary


WIKI_ONLY = "--task wiki only"


def build_parser() -> Parser:
    """The quick start's command line (``python -m agentic_rag.demo.quickstart``, ``bash script/quickstart.sh``)."""
    ap = Parser(prog="quickstart", description="The quick start (see the module docstring).")
    ap.add_argument("--task", choices=("world", "wiki"), default="world",
                    help="world (default): the embedded fictional world; wiki: 2WikiMultiHopQA questions over a "
                         "Wikipedia corpus from ../shared/data (agentic_rag.demo.wiki)")
    ap.add_argument("--out", default=None, help="output directory (default: outputs/quickstart, or "
                    "outputs/quickstart_wiki with --task wiki)")
    ap.add_argument("--tiny", action="store_true",
                    help="the tiny from-scratch model (a minute or two) instead of SmolLM2-135M-Instruct")
    ap.add_argument("--model", default=REAL_MODEL, help="the pretrained model: a GGUF file, a local directory, a hub "
                    f"name, or the packaged {REAL_MODEL} (default); ignored with --tiny")
    ap.add_argument("--seeds", type=positive_int, default=None,
                    help="how many GRPO seeds, each with its control run (default: 1; 3 with --tiny)")
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed (seeds are consecutive)")
    ap.add_argument("--world-seed", type=int, default=0, help="the fictional world's seed (default 0)")
    ap.add_argument("--steps", type=positive_int, default=None,
                    help="GRPO steps (default: the training config's, 10; 16 with --dialect native)")
    ap.add_argument("--workers", type=positive_int, default=None,
                    help="training runs at a time, sharing the cores (default: 1; 2 with --tiny)")
    ap.add_argument("--two-hop-correct", type=float, default=None,
                    help="share of the two-hop expert trajectories in the SFT data that search twice (default: "
                    f"{TWO_HOP_CORRECT['agentic']}; {TWO_HOP_CORRECT['native']} with --dialect native); the rest "
                    "take the one-search shortcut")
    ap.add_argument("--sft-epochs", type=positive_float, default=None, help="SFT epochs over the expert data "
                    "(default: 1 for the real model, 10 with --tiny)")
    ap.add_argument("--sft-batches", choices=SFT_BATCHES, default=None,
                    help="how the real model's SFT batches its examples: random (default) or by_length (as before "
                    "2026-11-23; the model then seldom searches twice: experiments/real_model/README.md)")
    wiki_only = ap.add_argument_group(WIKI_ONLY)
    wiki_only.add_argument("--fast", action="store_true",
                           help="the short recipe (128-token observations, exact-match reward, 4 GRPO steps: 72 min "
                                "on 2 cores) instead of the best measured one (256-token observations, token-F1 "
                                "reward, 16 steps: 1 h 48 min on 2 cores); the tiny model always runs the short "
                                "one")
    wiki_only.add_argument("--questions", type=positive_int, default=None,
                           help="the first N training and validation questions only (a smoke run)")
    wiki_only.add_argument("--hotpotqa", action="store_true", help="also evaluate the SFT and GRPO adapters on "
                           "HotpotQA dev (100 questions, an index of their own paragraphs)")
    wiki_only.add_argument("--sft-cpu-autocast", choices=CPU_AUTOCAST, default=None,
                           help="the real model's SFT on a CPU in bf16 (torch.autocast) or fp32 (none); default auto: "
                                "bf16 where the CPU computes it natively (AVX512-BF16, AMX), about half the time of "
                                "fp32 there")
    wiki_only.add_argument("--no-ablations", action="store_true",
                           help="skip the GRPO and SFT adapters' search-off evaluations")
    wiki_only.add_argument("--random-passages", action="store_true",
                           help="also evaluate the GRPO and SFT adapters searching an index that returns random "
                                "passages (about 10 more minutes on 2 cores)")
    ap.add_argument("--dialect", choices=dialect_choices(), default="agentic",
                    help="the format the model searches in: agentic (tags, the default) or native (the model's own "
                         "chat-template tool calls; world task, real model)")
    ap.add_argument("--move-aside", action="store_true",
                    help="when --out holds something else (a folder of yours, or a quick start made with other "
                         "settings), rename it to NAME.moved-TIMESTAMP and start there (nothing is deleted)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from ..malloc import release_freed_memory

    release_freed_memory()  # SFT and evaluation run in this process (see agentic_rag.malloc)
    ap = build_parser()
    wiki_only = next(g for g in ap._action_groups if g.title == WIKI_ONLY)
    args = ap.parse_args(argv)
    wiki = args.task == "wiki"
    given = [a.option_strings[0] for a in wiki_only._group_actions if getattr(args, a.dest) != a.default]
    if not wiki and given:
        ap.error(f"{', '.join(given)} are for --task wiki")
    if args.no_ablations and args.random_passages:
        ap.error("--random-passages adds ablation rows; --no-ablations skips them all: pass one of the two")
    if wiki and (args.two_hop_correct is not None or args.sft_batches is not None):
        ap.error("--two-hop-correct and --sft-batches are for the world task")
    seeds = args.seeds if args.seeds is not None else (3 if args.tiny and not wiki else 1)
    configure_logging("WARNING", fmt="%(levelname)s %(name)s: %(message)s")
    out = args.out or ("outputs/quickstart_wiki" if wiki else "outputs/quickstart")
    kw: dict[str, Any] = dict(out=Path(out).resolve(), seeds=list(range(args.first_seed, args.first_seed + seeds)),
                              world_seed=args.world_seed, grpo_steps=args.steps, move_aside=args.move_aside)
    if args.workers is not None:
        kw["workers"] = max(1, args.workers)
    if args.dialect != "agentic" and wiki:
        ap.error("--task wiki runs in the tag dialect; the wiki task's SFT in the native format, beside the tag "
                 "dialect's: python experiments/wiki/native_sft.py --out DIR --sft-lr 1e-3")
    if wiki:
        from .wiki import WikiSettings
        from .wiki import run as run_wiki

        kw.update(questions=args.questions, hotpotqa=args.hotpotqa, ablations=not args.no_ablations,
                  random_passages=args.random_passages, fast=args.fast or args.tiny)
        ws = WikiSettings.for_tiny(**kw) if args.tiny else WikiSettings(model=args.model, **kw)
        if args.sft_epochs is not None:
            ws.sft_epochs = args.sft_epochs
        if args.sft_cpu_autocast is not None:
            if args.tiny:
                ap.error("--sft-cpu-autocast is for the real model's LoRA SFT; the tiny model's stays fp32")
            ws.sft_cpu_autocast = args.sft_cpu_autocast
        return _timed("quick start (wiki)", ws.out, lambda: run_wiki(ws))
    if args.dialect != "agentic" and args.tiny:
        ap.error("--dialect native is for the world task's real model (the tiny model's word tokenizer has no chat "
                 "template)")
    s = Settings.for_tiny(**kw) if args.tiny else Settings(model=args.model, dialect=args.dialect, **kw)
    if args.sft_epochs is not None:
        s.sft_epochs = args.sft_epochs
    if args.sft_batches is not None:
        if args.tiny:
            ap.error("--sft-batches is for the real model's LoRA SFT; the tiny model's SFT always batches at random")
        s.sft_batches = args.sft_batches
    if args.two_hop_correct is not None:
        if not 0.0 <= args.two_hop_correct <= 1.0:
            ap.error(f"--two-hop-correct must be between 0 and 1, got {args.two_hop_correct}")
        s.two_hop_correct = args.two_hop_correct
    return _timed("quick start", s.out, lambda: run(s))


def _timed(what: str, out: Path, job: Callable[[], Any]) -> int:
    """Run the quick start behind the command line's error boundary, holding ``out``'s lock (one quick start per
    folder: a second is refused, naming the first); on success say how long it took."""
    from ..outputs import output_lock

    def locked() -> Any:
        with output_lock(out, "the quick start"):
            return job()

    started = time.perf_counter()
    status = guarded("quickstart", lambda: bool(locked()) and 0)
    if status == 0:
        print(f"{what} finished in {(time.perf_counter() - started) / 60:.1f} min")
    return status


if __name__ == "__main__":
    sys.exit(main())
