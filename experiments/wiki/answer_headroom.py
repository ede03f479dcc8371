"""What branching at the answer would find: for the multi-hop validation questions the SFT adapter answers wrong
greedily, keep its greedy trajectory up to the answer tag (its searches and the passages they returned) and sample
N answers from there at temperature 1. Counts the questions with at least one right answer among them, apart for
those whose observations hold the gold answer (a reading failure) and those whose do not (a search failure).

    python experiments/wiki/answer_headroom.py outputs/quickstart_wiki [--samples 16]

``headroom.py`` asks the same of whole rollouts (searches included); this asks it of the last step only, where
the failures analysed in README.md lie (the hop-2 passage found, the answer read wrong). A right answer among the
branches is what a GRPO group branching there (TreeRL, ARPO) would have to reinforce. The prefix is the recorded
trajectory's text tokenized again; greedy decoding from it is checked to give the recorded answer back. Prints one
JSON line last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("quickstart", type=Path, help="a wiki quick start's output directory (with eval/sft)")
    ap.add_argument("--samples", type=int, default=16, help="answers sampled per question (default 16)")
    ap.add_argument("--tiny", action="store_true",
                    help="QUICKSTART is a --tiny wiki quick start's output (its SFT a whole model; a pipeline check "
                         "whose numbers mean nothing)")
    args = ap.parse_args(argv)
    qs = args.quickstart.resolve()
    greedy_file = qs / "eval" / "sft" / "predictions.jsonl"
    if not greedy_file.exists():
        ap.error(f"no {greedy_file}: run the wiki quick start first (bash script/quickstart.sh --task wiki)")

    from agentic_rag.malloc import release_freed_memory

    release_freed_memory()  # as the quick start
    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.demo import wiki
    from agentic_rag.demo.quickstart import models_of
    from agentic_rag.evaluation.config import DatasetSection, EvalConfig, PolicySection
    from agentic_rag.evaluation.modes import mode_system_prompt
    from agentic_rag.evaluation.runner import build_policy, build_tokenizer
    from agentic_rag.rewards.accuracy import exact_match, normalize_answer
    from agentic_rag.rollout import SamplingParams
    from agentic_rag.rollout.protocol import get_dialect
    from agentic_rag.rollout.settings import SamplingSettings
    from agentic_rag.search.settings import SearchSettings

    # the recorded quick starts ran the short recipe
    s = wiki.WikiSettings.for_tiny(out=qs, seeds=[0]) if args.tiny else wiki.WikiSettings(out=qs, seeds=[0], fast=True)
    model, adapter = models_of(s, qs / "sft")
    rollout, prompt = wiki._rollout(s), wiki._prompt(s)
    n = args.samples
    cfg = EvalConfig(name="answer_headroom", dataset=DatasetSection(path=str(s.validation_file)),
                     policy=PolicySection(type="local", model=str(model), adapter=str(adapter), tokenizer=str(model),
                                          device="cpu"),
                     search=SearchSettings(index=str(s.index_dir)), rollout=rollout, prompt=prompt, mode="agent",
                     samples=n, sampling=SamplingSettings(temperature=1.0), batch_size=max(1, 128 // n),
                     metrics=["em"], output_dir=str(qs / "eval" / "answer_headroom"), seed=0)
    tok = build_tokenizer(cfg)
    policy = build_policy(cfg, tok)
    dialect = get_dialect(rollout.dialect)
    system = mode_system_prompt("agent", dialect, prompt.language, prompt.system_prompt)
    kinds = {q["id"]: q["kind"] for q in map(json.loads, open(s.validation_file))}
    items = []
    for p in map(json.loads, open(greedy_file)):
        if kinds.get(p["id"]) != "multi_hop" or p["metrics"]["em"] == 1.0 or p["finish_reason"] != "answer":
            continue
        text = p["trajectory"]
        prefix = text[:text.rfind(dialect.answer_open) + len(dialect.answer_open)]
        seen = normalize_answer(prefix)
        visible = any(normalize_answer(g) and normalize_answer(g) in seen for g in p["gold"])
        ids = build_prompt(tok, p["question"], rollout.dialect, language=prompt.language, chat=prompt.chat_template,
                           system=system) + tok(prefix, add_special_tokens=False)["input_ids"]
        items.append((p, ids, visible))
    print(f"{len(items)} multi-hop questions answered wrong greedily, {sum(v for *_, v in items)} with the gold "
          f"answer in the observations", flush=True)

    def answers(gens) -> list[str]:
        return [tok.decode(g.ids).split(dialect.answer_close)[0].strip() for g in gens]

    started = time.perf_counter()
    stops = [dialect.answer_close]
    policy.sampling = dataclasses.replace(policy.sampling, do_sample=False)
    again = answers(policy.generate([ids for _, ids, _ in items], stop_strings=stops, max_new_tokens=32))
    same = sum(normalize_answer(a) == normalize_answer(p["prediction"]) for (p, _, _), a in zip(items, again,
                                                                                                 strict=True))
    print(f"greedy from the prefix gives the recorded answer back: {same} of {len(items)}", flush=True)
    policy.sampling = SamplingParams(temperature=1.0)
    drawn = answers(policy.generate([ids for _, ids, _ in items for _ in range(n)], stop_strings=stops,
                                    max_new_tokens=32))
    out: dict = {"questions": len(items), "samples": n, "greedy_reproduced": same}
    for group in ("visible", "not_visible"):
        out[group] = {"questions": 0, "any_right": 0, "right_share": 0.0}
    for k, (p, _, visible) in enumerate(items):
        right = sum(exact_match(a, p["gold"]) for a in drawn[k * n:(k + 1) * n])
        group = out["visible" if visible else "not_visible"]
        group["questions"] += 1
        group["any_right"] += int(right > 0)
        group["right_share"] += right / n
        if right:
            print(json.dumps({"question": p["question"], "gold": p["gold"][0], "greedy": p["prediction"],
                              "right": int(right), "drawn": drawn[k * n:k * n + 8]}, ensure_ascii=False))
    for group in ("visible", "not_visible"):
        if out[group]["questions"]:
            out[group]["right_share"] = round(out[group]["right_share"] / out[group]["questions"], 3)
    out["seconds"] = round(time.perf_counter() - started)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
