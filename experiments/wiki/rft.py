"""Rejection-sampling fine-tuning (RFT) on the wiki task's half split: does the model improve on its own right
rollouts where GRPO did not (issue 31)?

    python experiments/wiki/rft.py --quickstart outputs/quickstart_wiki --samples 4 [--control]

Expert iteration in one round, as STaR (Zelikman et al. 2022) and RFT (Yuan et al. 2023) do it: the half-split SFT
adapter (``recipes.py``'s ``split_sft``: the quick start's SFT on the gold trajectories of half the training
questions) samples ``--samples`` rollouts (temperature 1) of each question of the other half, yes/no questions left
out (a right yes/no sample is a coin flip); the samples whose answer is right (EM 1) and that searched, distinct by
(queries, answer), are replayed through the real engine as scripted trajectories (their own queries and answer,
``wiki.trajectories``); then SFT from the base model, as STaR does (not from the adapter), on the SFT
half's gold trajectories plus those, with the quick start's SFT settings; then greedy validation on the 200
validation questions (Pyserini), against the split SFT start's ``eval/sft_split``. Differences from STaR: one round,
no rationalization (no gold-answer hints for the questions it got wrong).

``--control`` adds as many self-generated trajectories, question by question, as the right ones, drawn (seed 0)
among all the question's answered samples that searched, whatever their answer: what the filter adds over SFT on
the model's own rollouts.

Resumable: each stage is skipped when its output is complete. The record goes to
``--record``/runs/rft[_control][_seedN].json (``--sft-seed N``: the same kept trajectories, another SFT seed); the last
line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from recipes import grpo_half_file, quickstart_settings, scores, sft_start, split_sft  # noqa: E402

from agentic_rag.demo import wiki  # noqa: E402
from agentic_rag.demo.quickstart import models_of  # noqa: E402
from agentic_rag.outputs import atomic_write_text  # noqa: E402

KINDS = ("multi_hop", "pick_one")


def sample_file(s: wiki.WikiSettings) -> Path:
    """The GRPO half's multi-hop and pick-one questions (the ones sampled)."""
    path = s.out / "data" / "train_grpo_half_multi_hop_pick_one.jsonl"
    if not path.is_file():
        atomic_write_text(path, "".join(line for line in open(grpo_half_file(s)) if json.loads(line)["kind"] in KINDS))
    return path


def chosen(predictions: Path, control: bool) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Per sampled question: its record and the samples kept (the right ones that searched, distinct by queries and
    answer; with ``control``, as many drawn among all its answered samples that searched)."""
    rng = random.Random(0)
    out = []
    for line in open(predictions):
        rec = json.loads(line)
        answered = [x for x in rec["samples"] if x["prediction"] and x["finish_reason"] == "answer" and x["queries"]]
        right, seen = [], set()
        for x in answered:
            key = (tuple(x["queries"]), x["prediction"].strip())
            if x["metrics"]["em"] == 1.0 and key not in seen:
                seen.add(key)
                right.append(x)
        keep = rng.sample(answered, len(right)) if control else right
        if keep:
            out.append((rec, keep))
    return out


def scripted_questions(s: wiki.WikiSettings, picks, out: Path) -> int:
    """The kept samples as questions to replay: the training record's question, kind and type, the sample's queries
    as its hops and its answer as the answer. Returns how many."""
    train = {json.loads(line)["id"]: json.loads(line) for line in open(s.train_file)}
    rows = []
    for rec, keep in picks:
        src = train[rec["id"]]
        for j, x in enumerate(keep):
            rows.append({"id": f"{rec['id']}-s{j}", "question": src["question"], "answer": x["prediction"].strip(),
                         "kind": src["kind"], "type": src.get("type"), "hop_queries": x["queries"]})
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


def sampled_by_kind(predictions: Path) -> dict[str, dict[str, float]]:
    """Per question kind: questions, pass@n (a right sample among n) and mean EM over the samples."""
    out: dict[str, dict[str, float]] = {}
    for line in open(predictions):
        rec = json.loads(line)
        k = out.setdefault(rec.get("meta", {}).get("kind", "?"), {"questions": 0, "pass_at_n": 0.0, "mean_em": 0.0})
        ems = [x["metrics"]["em"] for x in rec["samples"]]
        k["questions"] += 1
        k["pass_at_n"] += max(ems)
        k["mean_em"] += sum(ems) / len(ems)
    return {kind: {"questions": v["questions"], "pass_at_n": round(v["pass_at_n"] / v["questions"], 3),
                   "mean_em": round(v["mean_em"] / v["questions"], 3)} for kind, v in out.items()}


def flips(before: Path, after: Path) -> dict[str, dict[str, int]]:
    """Per question kind, how many validation answers turned right and wrong between two evaluations."""
    old = {json.loads(line)["id"]: json.loads(line) for line in open(before)}
    out: dict[str, dict[str, int]] = {}
    for line in open(after):
        rec = json.loads(line)
        k = out.setdefault(rec.get("meta", {}).get("kind", "?"), {"right": 0, "wrong": 0})
        delta = rec["metrics"]["em"] - old[rec["id"]]["metrics"]["em"]
        if delta:
            k["right" if delta > 0 else "wrong"] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quickstart", type=Path, required=True, help="a real-model wiki quick start's output directory")
    ap.add_argument("--samples", type=int, default=4, help="rollouts sampled per question (temperature 1)")
    ap.add_argument("--control", action="store_true", help="keep samples regardless of their answer (see above)")
    ap.add_argument("--sft-seed", type=int, default=0, help="the SFT's seed (the samples are the same for every seed)")
    ap.add_argument("--record", type=Path, default=ROOT / "experiments" / "wiki")
    ap.add_argument("--tiny", action="store_true",
                    help="QUICKSTART is a --tiny wiki quick start's output (a pipeline check: its numbers mean "
                         "nothing, so give --record elsewhere)")
    args = ap.parse_args(argv)
    s = quickstart_settings(args.quickstart, tiny=args.tiny)
    # the kept trajectories are the same for every --sft-seed; other sample counts than the default get their own
    # files (the default's names are the ones the first runs were recorded under)
    kind = ("rft_control" if args.control else "rft") + ("" if args.samples == 4 else f"_samples{args.samples}")
    name = kind + (f"_seed{args.sft_seed}" if args.sft_seed else "")
    started = time.perf_counter()
    split_dir = split_sft(s)
    start = sft_start(s, True)
    print(f"split SFT start: {json.dumps(start)}", flush=True)

    sampled = wiki.evaluate(s, f"rft_samples{args.samples}", *models_of(s, split_dir), questions=sample_file(s),
                            samples=args.samples)
    print(f"samples: {json.dumps(sampled.get('samples'))}", flush=True)
    predictions = s.out / "eval" / f"rft_samples{args.samples}" / "predictions.jsonl"
    picks = chosen(predictions, args.control)
    kept = {k: sum(len(keep) for rec, keep in picks if rec.get("meta", {}).get("kind") == k) for k in KINDS}
    questions = s.out / "data" / f"{kind}_questions.jsonl"
    n = scripted_questions(s, picks, questions)
    print(f"kept {n} trajectories of {len(picks)} questions: {kept}", flush=True)
    trajs = s.out / f"sft_data_{kind}_replayed.jsonl"  # played through the real engine, as the gold ones are
    if n:
        replayed = wiki.trajectories(s, wiki.build_model(s), questions=questions, out=trajs)
    else:  # no sample kept (a policy that never answers right): the SFT half's gold trajectories alone
        atomic_write_text(trajs, "")
        replayed = {"trajectories": 0}
    data = s.out / f"sft_data_{kind}.jsonl"
    if not data.is_file():
        shutil.copy(s.out / "sft_data_split.jsonl.settings.json", f"{data}.settings.json")
        atomic_write_text(data, (s.out / "sft_data_split.jsonl").read_text() + trajs.read_text())
    adapter = wiki.sft(s, wiki.build_model(s), data=data, out=s.out / f"sft_{name}", seed=args.sft_seed)
    after = scores(wiki.evaluate(s, f"sft_{name}", *models_of(s, adapter)))
    record = {"recipe": name, "sft_seed": args.sft_seed, "samples_per_question": args.samples,
              "sampled": sampled.get("samples"),
              "sampled_by_kind": sampled_by_kind(predictions),
              "flips_vs_start": flips(s.out / "eval" / "sft_split" / "predictions.jsonl",
                                      s.out / "eval" / f"sft_{name}" / "predictions.jsonl"),
              "kept": {"trajectories": n, "questions": len(picks), "by_kind": kept}, "replay": replayed,
              "sft_start": start, "after": after, "wall_s": round(time.perf_counter() - started, 1),
              "command": " ".join(["python", "experiments/wiki/rft.py", *(argv or sys.argv[1:])])}
    out = args.record / "runs" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(record, indent=1) + "\n")
    print(json.dumps({"recipe": name, "start": [round(start["em"], 3), round(start.get("em_multi_hop", 0), 3)],
                      "after": [round(after["em"], 3), round(after.get("em_multi_hop", 0), 3)],
                      "kept": record["kept"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
