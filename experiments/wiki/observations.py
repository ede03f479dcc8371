"""Longer observations on the wiki task: does the SFT start read the answer it now sees, and does GRPO then move the
multi-hop group (issue 31)?

    python experiments/wiki/observations.py --quickstart QS --tokens 256 [--grpo] [--control] [--seed N]

Why: with the shipped 128-token observation (one passage a search) the gold answer is visible in only 70% of the
multi-hop gold trajectories the SFT imitates (``sft_data.stats.json``), so 30% of them teach answering what was not
read; in 86 of those 120 the answer is further down a passage already shown. This runs the quick start's wiki
pipeline with ``rollout.max_observation_tokens`` = ``--tokens`` (and ``max_completion_tokens`` raised by 4x the
difference, room for four searches): the gold trajectories of the same training questions, the quick start's SFT
from the base model on them, greedy validation on the 200 validation questions (Pyserini); with ``--grpo``, the
shipped whole-rollout GRPO recipe (lr 1e-4, 8 questions x 4 rollouts, EM + 0.2 format) from that SFT adapter for
``--steps`` steps, validated greedily every ``--validate-every`` (4) and at the end; ``--control`` the same with the
rewards shuffled in each batch; ``--seed`` the GRPO runs' seed (the SFT start is the same for every seed);
``--reward f1`` token F1 in place of EM (runs and record named ``*-f1-*``, ``obsN_f1*``), ``--reward f1_ragas``
token F1 + 0.5 RAGAS id_recall (the share of the question's gold titles among the passages shown: a reward for the
hop-2 search itself; ``*-f1_ragas-*``); ``--multi-hop-copies K``
trains (GRPO and control alike) on a pool that holds each multi-hop training question K times, so more of the
batches' questions are multi-hop (K = 3: 77% of the pool against 53%; runs and record named ``*-mhK-*``,
``obsN*_mhK*``); ``--scale-rewards group`` divides each advantage by its group's reward std (the GRPO paper's; the
recipe scales nothing), so a multi-hop group whose F1s differ by a little weighs as much as a pick-one group whose
answers differ by a whole name (runs and record named ``*-stdgroup-*``, ``obsN*_stdgroup*``); ``--low-memory``
trains with gradient checkpointing and decodes the greedy validation 32 rows at a time instead of 128, which took a
256-token run from ~9 GB to 3.5 GB, with the same validation answers but ~30% more time a step (most likely the
recomputation; ``experiments/wiki/README.md``): it changes how a run is computed, not what, so it names no run,
and a run already finished is not run again. The SFT start's
record compares it with the quick start's own SFT where that exists (a quick start
cut to its data steps has none). With
``--continue-from N`` the runs go on from the step-N checkpoint of the N-step runs of the same seed (their
validations kept) to ``--steps``: a longer run without retraining its first N steps (the learning rate is
constant in this recipe, so the schedule does not depend on the length).

Everything goes under ``QUICKSTART/obsN`` (its own config, trajectories, adapter, evaluations and runs); each stage is
skipped when its output is complete, and a run killed half way goes on from its last checkpoint (every 2 steps). The
record goes to ``--record``/runs/obsN[_f1][_seedS][_Msteps].json; the last line printed is one JSON object: the SFT
start's and each run's validation EM (overall, multi-hop).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from recipes import F1, curves, quickstart_settings, scores  # noqa: E402
from rft import flips  # noqa: E402

from agentic_rag.demo import wiki  # noqa: E402
from agentic_rag.demo.quickstart import models_of, train_run  # noqa: E402
from agentic_rag.outputs import atomic_write_text  # noqa: E402
from agentic_rag.settings import get_dotted, read_yaml  # noqa: E402


@dataclass
class ObservationSettings(wiki.WikiSettings):
    """The wiki quick start's settings whose training config (where the rollout limits come from) is ``config``."""

    config: Path | None = None

    @property
    def train_config(self) -> Path:
        return self.config or wiki.WIKI_CONFIG


def write_config(tokens: int, path: Path) -> Path:
    """The shipped wiki config with ``tokens``-token observations and room for four of them."""
    cfg = yaml.safe_load(wiki.WIKI_CONFIG.read_text())
    old = cfg["rollout"]["max_observation_tokens"]
    cfg["rollout"]["max_observation_tokens"] = tokens
    cfg["rollout"]["max_completion_tokens"] += 4 * (tokens - old)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(cfg, sort_keys=False))
    return path


FIRST_STEPS = 8  # the first runs' length: their folders and records carry no step count
# --low-memory: gradient checkpointing, and 32 rows decoding together. A GRPO step's 8 x 4 rollouts stay one batch;
# the greedy validation's 128 (the trainer's VALIDATION_ROWS) come down to 32, a quarter of the KV cache
LOW_MEMORY = {"model.gradient_checkpointing": "true", "sampling.max_batch_size": 32}

# --reward: the GRPO runs' reward (and their controls', shuffled); the first runs' EM carries no name
F1_RAGAS = F1[:-1] + ", {name: ragas, weight: 0.5, params: {metric: id_recall}}]"
REWARDS = {"em": {}, "f1": {"rewards": F1}, "f1_ragas": {"rewards": F1_RAGAS}}


def variant(reward: str = "em", copies: int = 1, scale: str = "none") -> list[str]:
    """The tags that name a run's variant in its folder and its record: the reward unless EM, ``mhK`` unless 1,
    ``stdS`` unless the recipe's ``scale_rewards: none``."""
    return (([] if reward == "em" else [reward]) + ([] if copies == 1 else [f"mh{copies}"])
            + ([] if scale == "none" else [f"std{scale}"]))


def run_folder(run: str, steps: int, seed: int, reward: str = "em", copies: int = 1, scale: str = "none") -> str:
    run = "-".join([run, *variant(reward, copies, scale)])
    return f"{run}-seed{seed}" if steps == FIRST_STEPS else f"{run}-{steps}steps-seed{seed}"


def run_settings(run: Path, keys: Any) -> dict[str, str]:
    """The run's values of the dotted ``keys`` as its ``config.yaml`` records them: what it trained with, where a
    later call (another ``--validate-every``, say) found it finished and skipped it."""
    cfg = read_yaml(run / "config.yaml")
    return {key: str(get_dotted(cfg, key)) for key in keys}


def weighted_train_file(train_file: Path, copies: int) -> Path:
    """``train_file`` with each multi-hop question ``copies`` times (the copies right after it: the trainer draws
    its batches at random); the file itself when ``copies`` is 1. Written once, beside ``train_file``."""
    if copies == 1:
        return train_file
    path = train_file.with_name(f"{train_file.stem}_mh{copies}.jsonl")
    if not path.is_file():
        lines = []
        for line in train_file.read_text().splitlines(keepends=True):
            lines += [line] * (copies if json.loads(line)["kind"] == "multi_hop" else 1)
        atomic_write_text(path, "".join(lines))
    return path


def continue_run(runs: Path, run: str, seed: int, shorter: int, steps: int, reward: str = "em",
                 copies: int = 1, scale: str = "none") -> None:
    """Seed the ``steps``-step run's folder with the ``shorter``-step run's step-``shorter`` checkpoint and its
    validations, so that train_run resumes there; nothing to do once the folder holds a checkpoint."""
    from agentic_rag.training.checkpoints import COMPLETE_MARKER, latest_complete_checkpoint

    if not 0 < shorter < steps:
        raise SystemExit(f"--continue-from {shorter}: must lie between 0 and --steps {steps}")
    src = runs / run_folder(run, shorter, seed, reward, copies, scale)
    dst = runs / run_folder(run, steps, seed, reward, copies, scale)
    if dst.exists() and latest_complete_checkpoint(dst, quarantine=False):
        return
    ckpt = src / f"checkpoint-{shorter}"
    if not (ckpt / COMPLETE_MARKER).is_file():
        raise SystemExit(f"--continue-from {shorter}: {ckpt} is not a complete checkpoint; run the {shorter}-step "
                         f"runs first (--steps {shorter})")
    dst.mkdir(parents=True, exist_ok=True)
    if (src / "validation").is_dir():
        shutil.copytree(src / "validation", dst / "validation", dirs_exist_ok=True)
    if (src / "validation.jsonl").is_file():
        shutil.copy2(src / "validation.jsonl", dst / "validation.jsonl")
    # the checkpoint last and whole (its completion marker could be copied before its weights): a copy killed half
    # way leaves a .partial folder that nothing resumes from, and the next call copies again
    partial = dst / f"{ckpt.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(ckpt, partial)
    partial.rename(dst / ckpt.name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quickstart", type=Path, required=True, help="a real-model wiki quick start's output directory")
    ap.add_argument("--tokens", type=int, default=256, help="tokens of one observation (the shipped config: 128)")
    ap.add_argument("--grpo", action="store_true", help="GRPO from the SFT adapter")
    ap.add_argument("--control", action="store_true", help="and its shuffled-reward control")
    ap.add_argument("--steps", type=int, default=FIRST_STEPS)
    ap.add_argument("--continue-from", type=int, default=None, metavar="N",
                    help="go on from the N-step runs' step-N checkpoint instead of the SFT adapter")
    ap.add_argument("--seed", type=int, default=0, help="the GRPO runs' seed")
    ap.add_argument("--reward", choices=sorted(REWARDS), default="em",
                    help="the GRPO runs' answer reward, + 0.2 format (em: the shipped recipe; f1: token F1, partial "
                         "credit for a near answer; f1_ragas: f1 + 0.5 RAGAS id_recall, the share of the question's "
                         "gold titles among the passages shown)")
    ap.add_argument("--multi-hop-copies", type=int, default=1, metavar="K",
                    help="each multi-hop training question K times in the GRPO runs' pool (1: the training file as is)")
    ap.add_argument("--scale-rewards", choices=["none", "group", "batch"], default="none",
                    help="the GRPO runs' advantage scaling (none: the recipe's, Dr. GRPO; group: each advantage "
                         "divided by its group's reward std, the GRPO paper's, so a group whose F1s differ by a "
                         "little weighs as much as one whose EMs differ by 1)")
    ap.add_argument("--low-memory", action="store_true",
                    help="gradient checkpointing and 32 greedy validation rows at a time (a 256-token run in 3.5 GB "
                         "instead of ~9, ~30%% slower a step)")
    ap.add_argument("--validate-every", type=int, default=4,
                    help="steps between greedy validations (0: at the end only; one costs 10-13 min on 2 cores)")
    ap.add_argument("--record", type=Path, default=ROOT / "experiments" / "wiki")
    ap.add_argument("--tiny", action="store_true",
                    help="QUICKSTART is a --tiny wiki quick start's output (a pipeline check: its numbers mean "
                         "nothing, so give --record elsewhere)")
    args = ap.parse_args(argv)
    if args.multi_hop_copies < 1:
        ap.error(f"--multi-hop-copies {args.multi_hop_copies}: must be 1 or more")
    qs = args.quickstart.resolve()
    name = f"obs{args.tokens}"
    work = qs / name
    s = quickstart_settings(qs, ObservationSettings, tiny=args.tiny)  # exits before writing anything when qs is not one
    s.config = write_config(args.tokens, work / "wiki_grpo.yaml")
    started = time.perf_counter()
    init = wiki.build_model(s)
    stats = wiki.trajectories(s, init, out=work / "sft_data.jsonl")
    print(f"gold trajectories: answer visible by kind {stats['answer_visible_by_kind']}, "
          f"{stats['mean_completion_tokens']} completion tokens on average", flush=True)
    adapter = wiki.sft(s, init, data=work / "sft_data.jsonl", out=work / "sft")
    start = scores(wiki.evaluate(s, f"{name}_sft", *models_of(s, adapter)))
    print(f"SFT start: {json.dumps(start)}", flush=True)
    record: dict[str, Any] = {
        "recipe": name, "reward": args.reward, "seed": args.seed, "tokens": args.tokens, "config": str(s.config),
        "trajectories": stats,
        "multi_hop_copies": args.multi_hop_copies, "scale_rewards": args.scale_rewards, "sft_start": start,
        "runs": {}}
    shipped = qs / "eval" / "sft"
    if (shipped / "summary.json").is_file():  # a quick start that ran its own SFT (not one cut to its data steps)
        record["shipped_sft"] = scores(json.loads((shipped / "summary.json").read_text()))
        record["flips_vs_shipped_sft"] = flips(shipped / "predictions.jsonl",
                                               qs / "eval" / f"{name}_sft" / "predictions.jsonl")
    scale = {} if args.scale_rewards == "none" else {"algorithm.scale_rewards": args.scale_rewards}
    runs = [("grpo", {**REWARDS[args.reward], **scale})] if args.grpo else []
    if args.grpo and args.control:
        runs.append(("control", {**REWARDS[args.reward], **scale, "algorithm.shuffle_rewards": "true"}))
    train_file = weighted_train_file(s.train_file, args.multi_hop_copies)  # the same pool for GRPO and control
    pool = {"data.train_file": train_file} if train_file != s.train_file else {}
    memory = LOW_MEMORY if args.low_memory else {}
    for run_name, extra in runs:
        sets = {"logging.validation_every": args.validate_every, "logging.validation_at_start": "false",
                "algorithm.max_steps": args.steps, "logging.validation_file": s.validation_file, **pool, **memory,
                **extra}
        if args.continue_from is not None:
            continue_run(work / "runs", run_name, args.seed, args.continue_from, args.steps, args.reward,
                         args.multi_hop_copies, args.scale_rewards)
        folder = run_folder(run_name, args.steps, args.seed, args.reward, args.multi_hop_copies, args.scale_rewards)
        run = train_run(s, adapter, folder, args.seed, sets, runs_dir=work / "runs")
        record["runs"][run_name] = {"sets": run_settings(run, sets),
                                    "validation": wiki.validation_curve(run), "curves": curves(run)}
        for v in record["runs"][run_name]["validation"]:
            print(f"{run_name}: step {v['step']} {v['eval/em']:.3f} / {v.get('eval/em_multi_hop', 0):.3f}", flush=True)
    record["wall_s"] = round(time.perf_counter() - started, 1)
    record["command"] = " ".join(["python", "experiments/wiki/observations.py", *(argv or sys.argv[1:])])
    stem = "_".join([name, *variant(args.reward, args.multi_hop_copies, args.scale_rewards)])
    stem += f"_seed{args.seed}" if args.seed else ""
    stem += "" if args.steps == FIRST_STEPS else f"_{args.steps}steps"
    out = args.record / "runs" / f"{stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(record, indent=1) + "\n")
    print(json.dumps({"recipe": name, "start": [round(start["em"], 3), round(start.get("em_multi_hop", 0), 3)],
                      "runs": {k: {v["step"]: [round(v["eval/em"], 3), round(v.get("eval/em_multi_hop", 0), 3)]
                                   for v in r["validation"]} for k, r in record["runs"].items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
