"""The GRPO recipe search of the wiki task: SmolLM2-135M-Instruct from the wiki quick start's SFT adapter, trained
by each recipe and scored greedily on the validation split while it trains (issue 31).

    python experiments/wiki/recipes.py --quickstart outputs/quickstart_wiki --recipes start,multi_f1 --seeds 0

Each recipe is a set of ``--set`` overrides of the packaged ``wiki_grpo_smollm2.yaml`` (the quick start's
training config), optionally with a training file restricted to some question kinds (``kinds``), in
:data:`RECIPES`. A recipe with ``split`` starts from an SFT adapter of its own, fitted on half the training
questions (every other question of each kind, in file order: :func:`split_sft`), and trains GRPO on the other
half, so its rollouts answer questions the SFT never saw (as validation does); its SFT start is scored the same
way as the quick start's and recorded with it. A run validates greedily on the 200 validation questions every
``logging.validation_every`` steps and at its end (the SFT start's score is the quick start's ``eval/sft``, or
``eval/sft_split``, measured once, so the runs skip the step-0 validation): the curve says where a recipe peaks.

Resumable: each finished (recipe, seed) is a JSON record under ``--record``/runs and is skipped; a run killed half
way goes on from its last checkpoint. One run at a time, with every core. The record holds the validation curve
(EM overall and per kind, searches per question), the per-step training curves (reward, accuracy, searches per
trajectory, entropy of the policy's tokens, mean completion length, the share of question groups whose accuracy
differs), the wall clock and the command. The last line printed is one JSON object: per recipe and seed, the
validation EM (overall, multi-hop) at each validation step, against the SFT start's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from agentic_rag.demo import wiki  # noqa: E402
from agentic_rag.demo.quickstart import models_of, train_run  # noqa: E402
from agentic_rag.outputs import atomic_write_text  # noqa: E402

EVERY = 4  # validation every 4 steps
STEPS = 12  # every recipe's length unless it says (the shipped config stops at 4, the curves' peak)
F1 = '[{name: f1, weight: 1.0}, {name: format, weight: 0.2}]'
EM = '[{name: em, weight: 1.0}, {name: format, weight: 0.2}]'
RAGAS = ('[{name: em, weight: 1.0}, {name: format, weight: 0.2}, '
         '{name: ragas, weight: 0.5, params: {metric: id_recall}}]')
MULTI = ("multi_hop",)
LR3 = "3e-4"  # the learning rate the config shipped with first (1e-4 since: experiments/wiki/README.md)

ANSWER_BRANCH = {"algorithm.answer_branching": "true", "algorithm.num_generations": 8,
                 "algorithm.per_device_train_batch_size": 8, "algorithm.learning_rate": 1e-4}

# name -> what it changes against the shipped config (help), its --set overrides, the question kinds it trains on
RECIPES: dict[str, dict[str, Any]] = {
    "start": {"help": "the config as first shipped: EM + 0.2 format, T 1.0, 8 questions x 4, lr 3e-4, 12 steps",
              "sets": {"algorithm.learning_rate": LR3}},
    "shipped": {"help": "start with lr 1e-4 (the shipped config's rate; it stops at step 4)", "sets": {}},
    "control": {"help": "shipped, with the rewards shuffled within each batch",
                "sets": {"algorithm.shuffle_rewards": "true"}},
    "multi_f1_t07": {"help": "multi-hop training questions only, F1 + 0.2 format, T 0.7",
                     "sets": {"algorithm.learning_rate": LR3, "rewards": F1, "sampling.temperature": 0.7},
                     "kinds": MULTI},
    "multi_em_g8": {"help": "multi-hop training questions only, EM + 0.2 format, 4 questions x 8 rollouts, T 0.7",
                    "sets": {"algorithm.learning_rate": LR3, "sampling.temperature": 0.7,
                             "algorithm.num_generations": 8}, "kinds": MULTI},
    "multi_ragas_t07": {"help": "multi-hop training questions only, EM + 0.2 format + 0.5 RAGAS id_recall (the share "
                                "of the question's gold passages the searches showed), T 0.7",
                        "sets": {"algorithm.learning_rate": LR3, "rewards": RAGAS, "sampling.temperature": 0.7},
                        "kinds": MULTI},
    "all_em_lr1e4": {"help": "start with learning rate 1e-4 (validated at step 0 too: the trainer's greedy validation "
                             "against the evaluation runner's SFT row)",
                     "sets": {"algorithm.learning_rate": 1e-4, "logging.validation_at_start": "true"}},
    "all_em_t05_lr1e4": {"help": "start with temperature 0.5 and learning rate 1e-4: rollouts near the greedy policy",
                         "sets": {"sampling.temperature": 0.5, "algorithm.learning_rate": 1e-4}},
    "all_ragas_lr1e4": {"help": "every kind, EM + 0.2 format + 0.5 RAGAS id_recall, T 1.0, learning rate 1e-4",
                        "sets": {"rewards": RAGAS, "algorithm.learning_rate": 1e-4}},
    "all_ragas_lr1e4_kl": {"help": "all_ragas_lr1e4 with a KL penalty of 0.05 against the SFT adapter",
                           "sets": {"rewards": RAGAS, "algorithm.learning_rate": 1e-4, "algorithm.beta": 0.05}},
    "all_f1_t07": {"help": "every kind, F1 + 0.2 format, T 0.7",
                   "sets": {"algorithm.learning_rate": LR3, "rewards": F1, "sampling.temperature": 0.7}},
    "all_f1_lr1e4_long": {"help": "every kind, F1 + 0.2 format, T 1.0, lr 1e-4 (the GPU screen's best at 12 steps) "
                                  "for 36 steps, validated every 9",
                          "sets": {"algorithm.learning_rate": 1e-4, "rewards": F1, "algorithm.max_steps": 36,
                                   "logging.validation_every": 9}},
    "answer_branch": {"help": "answer branching: a group is one greedy trunk cut after its answer tag and 8 answers "
                              "sampled there (T 1.0), trained on the answers only; 8 questions x 8 answers, EM + 0.2 "
                              "format, lr 1e-4",
                      "sets": ANSWER_BRANCH},
    "answer_branch_lr3e4": {"help": "answer_branch with learning rate 3e-4, 8 steps",
                            "sets": {**ANSWER_BRANCH, "algorithm.learning_rate": LR3, "algorithm.max_steps": 8}},
    "answer_branch_control": {"help": "answer_branch with the rewards shuffled within each batch",
                              "sets": {**ANSWER_BRANCH, "algorithm.shuffle_rewards": "true"}},
    "split_answer_branch": {"help": "answer_branch from an SFT adapter fitted on half the training questions, "
                                    "trained on the other half (381 questions the SFT never saw)",
                            "sets": ANSWER_BRANCH, "split": True},
    "split_answer_branch_control": {"help": "split_answer_branch with the rewards shuffled within each batch",
                                    "sets": {**ANSWER_BRANCH, "algorithm.shuffle_rewards": "true"}, "split": True},
    "split_answer_branch_multi_lr3e4": {"help": "split_answer_branch on the GRPO half's multi-hop questions only "
                                                "(203), lr 3e-4, 8 steps",
                                        "sets": {**ANSWER_BRANCH, "algorithm.learning_rate": LR3,
                                                 "algorithm.max_steps": 8}, "split": True, "kinds": MULTI},
    "split_shipped": {"help": "the shipped whole-rollout recipe (8 questions x 4, EM + 0.2 format, lr 1e-4) from the "
                              "half-split SFT adapter, trained on the other half",
                      "sets": {}, "split": True},
    "split_control": {"help": "split_shipped with the rewards shuffled within each batch",
                      "sets": {"algorithm.shuffle_rewards": "true"}, "split": True},
}


def split_halves(s: wiki.WikiSettings) -> tuple[list[str], list[str]]:
    """(SFT half, GRPO half) of the training file's lines: within each kind, alternately, in file order."""
    seen: dict[str, int] = {}
    halves: tuple[list[str], list[str]] = ([], [])
    for line in open(s.train_file):
        kind = json.loads(line)["kind"]
        halves[seen.get(kind, 0) % 2].append(line)
        seen[kind] = seen.get(kind, 0) + 1
    return halves


def grpo_half_file(s: wiki.WikiSettings) -> Path:
    """The training file of the split recipes: the GRPO half (written by :func:`split_sft`)."""
    return s.out / "data" / "train_grpo_half.jsonl"


def split_sft(s: wiki.WikiSettings) -> Path:
    """The SFT adapter of the split recipes (``OUT/sft_split``): the quick start's SFT (same settings) on the gold
    trajectories of the SFT half only; made once, resumable. Also writes the GRPO half's training file."""
    sft_half, grpo_half = split_halves(s)
    grpo_file = grpo_half_file(s)
    if not grpo_file.is_file():
        atomic_write_text(grpo_file, "".join(grpo_half))
    ids = {json.loads(line)["id"] for line in sft_half}
    data = s.out / "sft_data_split.jsonl"
    if not data.is_file():
        full = s.out / "sft_data.jsonl"
        shutil.copy(f"{full}.settings.json", f"{data}.settings.json")
        atomic_write_text(data, "".join(line for line in open(full) if json.loads(line)["id"] in ids))
    return wiki.sft(s, wiki.build_model(s), data=data, out=s.out / "sft_split")


def recipe_sets(s: wiki.WikiSettings, name: str) -> dict[str, Any]:
    """The overrides of one recipe, with its training file written when it trains on some kinds only."""
    r = RECIPES[name]
    sets = {"logging.validation_every": EVERY, "logging.validation_at_start": "false", "algorithm.max_steps": STEPS,
            "logging.validation_file": s.validation_file, **r["sets"]}
    kinds = r.get("kinds")
    train_file = grpo_half_file(s) if r.get("split") else s.train_file
    if kinds:
        path = s.out / "data" / f"{train_file.stem}_{'_'.join(kinds)}.jsonl"
        if not path.is_file():
            atomic_write_text(path, "".join(line for line in open(train_file) if json.loads(line)["kind"] in kinds))
        train_file = path
    if train_file != s.train_file:
        sets["data.train_file"] = train_file
    return sets


def curves(run: Path) -> dict[str, list[float]]:
    history = json.loads((run / "train_summary.json").read_text())["log_history"]
    keys = {"reward": "reward", "accuracy": None, "searches": "agentic/searches_per_trajectory", "entropy": "entropy",
            "completion_length": "completions/mean_length", "mixed_groups": None}
    out: dict[str, list[float]] = {}
    for name, key in keys.items():
        if key is None:
            suffix = "_mixed_groups" if name == "mixed_groups" else None
            found = next((k for h in history for k in h if (suffix and k.endswith(suffix)) or
                          (name == "accuracy" and k in ("rewards/em/mean", "rewards/f1/mean"))), None)
            key = found
        out[name] = [h[key] for h in history if key and key in h]
    return out


def validation(run: Path) -> list[dict[str, Any]]:
    return wiki.validation_curve(run)


def run_name(name: str, seed: int, steps: int | None = None) -> str:
    """A recipe's run folder and record: ``NAME-seedS``, ``NAME-Nsteps-seedS`` when ``--steps`` cut it."""
    return f"{name}-seed{seed}" if steps is None else f"{name}-{steps}steps-seed{seed}"


def one(s: wiki.WikiSettings, name: str, seed: int, runs_dir: Path, steps: int | None = None) -> dict[str, Any]:
    sft_dir = split_sft(s) if RECIPES[name].get("split") else s.out / "sft"
    sets = recipe_sets(s, name)
    if steps is not None:
        sets["algorithm.max_steps"] = steps
    started = time.perf_counter()
    run = train_run(s, sft_dir, run_name(name, seed, steps), seed, sets, runs_dir=runs_dir)
    summary = json.loads((run / "train_summary.json").read_text())
    return {"recipe": name, "seed": seed, "help": RECIPES[name]["help"], "run": str(run),
            "sets": {k: str(v) for k, v in sets.items()}, "validation": validation(run), "curves": curves(run),
            "wall_s": round(time.perf_counter() - started, 1), "train_runtime_s": summary.get("train_runtime_s"),
            "peak_rss_mb": summary.get("peak_rss_mb")}


def quickstart_settings(path: Path, cls: type[wiki.WikiSettings] = wiki.WikiSettings, tiny: bool = False,
                        **extra: Any) -> wiki.WikiSettings:
    """The settings of the real-model wiki quick start in ``path`` (as ``cls``, with ``extra``); exits when it is not
    one. ``tiny``: of a ``--tiny`` wiki quick start instead (its SFT settings; a pipeline check, whose numbers mean
    nothing), and only of one."""
    saved = json.loads((path / "settings.json").read_text())
    if saved.get("task") != "wiki" or bool(saved.get("tiny")) != tiny:
        raise SystemExit(f"{path} is not a {'tiny' if tiny else 'real-model'} wiki quick start")
    if tiny:
        s = cls.for_tiny(out=path.resolve(), seeds=[0], questions=saved.get("questions"), **extra)
        s.sft_epochs, s.sft_learning_rate = saved["sft_epochs"], saved["sft_learning_rate"]
        return s
    # the recipe it was made with: every recorded one ran the short recipe (--fast), which these recipes build on
    best = hashlib.sha256(wiki.WIKI_BEST_CONFIG.read_bytes()).hexdigest()
    extra.setdefault("fast", saved.get("train_config_sha256") != best)
    return cls(out=path.resolve(), seeds=[0], questions=saved.get("questions"), **extra)


def scores(summary: dict[str, Any]) -> dict[str, Any]:
    """An evaluation summary's EM, F1, EM per question kind and searches per question (``wiki.eval_point``'s
    ``eval/`` numbers, without the prefix)."""
    point = wiki.eval_point(summary, 0, "")
    return {k.removeprefix("eval/"): v for k, v in point.items() if k.startswith("eval/")}


def sft_start(s: wiki.WikiSettings, split: bool = False) -> dict[str, Any]:
    """The greedy validation scores of the SFT start (the split recipes': their own adapter's, ``eval/sft_split``)."""
    if split:
        return scores(wiki.evaluate(s, "sft_split", *models_of(s, split_sft(s))))
    return scores(wiki.evaluate(s, "sft", *models_of(s, s.out / "sft")))


def brief(record: dict[str, Any]) -> dict[str, Any]:
    vs = record["validation"]
    return {"recipe": record["recipe"], "seed": record["seed"],
            "sft_start": (round(record["sft_start"]["em"], 3), round(record["sft_start"].get("em_multi_hop", 0), 3))
            if "sft_start" in record else None,
            "em": {v["step"]: round(v["eval/em"], 3) for v in vs},
            "em_multi_hop": {v["step"]: round(v.get("eval/em_multi_hop", float("nan")), 3) for v in vs},
            "searches": {v["step"]: round(v["eval/searches"], 2) for v in vs}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quickstart", type=Path, required=True, help="a real-model wiki quick start's output directory "
                    "(its SFT finished)")
    ap.add_argument("--recipes", default="start", help=f"comma-separated, of: {', '.join(RECIPES)}")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "outputs" / "wiki_recipes")
    ap.add_argument("--record", type=Path, default=ROOT / "experiments" / "wiki")
    ap.add_argument("--steps", type=int, default=None,
                    help="every recipe's length (default: the recipe's own, 12 unless it says); the runs and records "
                         "are named NAME-Nsteps-seedS")
    ap.add_argument("--tiny", action="store_true",
                    help="QUICKSTART is a --tiny wiki quick start's output (a pipeline check: its numbers mean "
                         "nothing, so give --record and --runs-dir elsewhere)")
    args = ap.parse_args(argv)
    names = [r.strip() for r in args.recipes.split(",") if r.strip()]
    unknown = [r for r in names if r not in RECIPES]
    if unknown:
        ap.error(f"unknown recipe(s) {unknown}; known: {', '.join(RECIPES)}")
    if args.steps is not None and args.steps < 1:
        ap.error(f"--steps {args.steps}: must be 1 or more")
    s = quickstart_settings(args.quickstart, tiny=args.tiny)
    if not (args.quickstart / "sft" / "sft_summary.json").is_file():
        raise SystemExit(f"{args.quickstart} has no finished SFT: run the wiki quick start there first")
    start = sft_start(s)
    print(f"SFT start: {json.dumps(start)}", flush=True)
    done_dir = args.record / "runs"
    done_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for seed in (int(x) for x in args.seeds.split(",")):
        for name in names:
            path = done_dir / f"{run_name(name, seed, args.steps)}.json"
            if path.is_file():
                records.append(json.loads(path.read_text()))
                continue
            print(f"== {name}, seed {seed}: {RECIPES[name]['help']}", flush=True)
            own_start = start
            if RECIPES[name].get("split"):
                own_start = sft_start(s, True)
                print(f"   split SFT start: {json.dumps(own_start)}", flush=True)
            record = one(s, name, seed, args.runs_dir, args.steps)
            record["command"] = " ".join(["python", "experiments/wiki/recipes.py", *(argv or sys.argv[1:])])
            record["sft_start"] = own_start
            atomic_write_text(path, json.dumps(record, indent=1) + "\n")
            records.append(record)
            print(f"   {json.dumps(brief(record))}", flush=True)
    print(json.dumps({"sft_start": start, "runs": [brief(r) for r in records],
                      "mean_final_em": statistics.fmean(r["validation"][-1]["eval/em"] for r in records)
                      if records else None}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
