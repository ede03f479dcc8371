"""Why an evaluation's multi-hop answers fail: for each multi-hop validation question of a predictions.jsonl
(``agentic-rag eval`` output), whether the searches found the gold passage of hop 1 and of every hop, whether the
gold answer was visible in an observation, whether the answer was right, and whether the hop-2 entity that the first
observation names was what the second query searched for. Prints one JSON line of counts.

    python experiments/wiki/failures.py outputs/quickstart_wiki/eval/sft/predictions.jsonl \\
        outputs/quickstart_wiki/data/validation.jsonl

It also reads a training run's per-question greedy validation file (``RUN/validation/stepN.jsonl``: question,
queries, answer, em; no observations), for the counts the queries alone give: whether the second query names the
hop-2 gold title (``second_query_is_hop2``), repeats the first, and how many of those questions were answered right.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from agentic_rag.rewards.accuracy import normalize_answer  # noqa: E402


def contains(text: str, answer: str) -> bool:
    a = normalize_answer(answer)
    return bool(a) and f" {a} " in f" {text} "


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("predictions", type=Path)
    ap.add_argument("questions", type=Path, help="the split's question file (with kind and hop_titles)")
    args = ap.parse_args(argv)
    with args.questions.open() as f:
        rows = list(map(json.loads, f))
    questions = {q["id"]: q for q in rows} | {q["question"]: q for q in rows}
    c: collections.Counter[str] = collections.Counter()
    with args.predictions.open() as f:
        for p in map(json.loads, f):
            q = questions[p.get("id", p["question"])]
            if q["kind"] != "multi_hop":
                continue
            queries, right = p["queries"], p.get("em", p.get("metrics", {}).get("em")) == 1.0
            hop2 = q["hop_titles"][1] if len(q.get("hop_titles", [])) > 1 else None
            second = normalize_answer(queries[1]) if len(queries) > 1 else ""
            named = bool(hop2) and (contains(second, hop2) or (len(second) > 3 and second in normalize_answer(hop2)))
            c["second_query_is_hop2"] += named
            c["second_query_is_hop2_and_right"] += named and right
            c["second_query_repeats_first"] += bool(second) and second == normalize_answer(queries[0])
            if "trajectory" not in p:  # a validation file: the queries are all there is
                c["questions"] += 1
                c["right"] += right
                continue
            obs = " ".join(re.findall(r"<observation>(.*?)</observation>", p["trajectory"], re.S))
            titles = {t.strip() for t in re.findall(r"\(\d\) ([^\n]*)\n", obs)}
            hops = [t in titles for t in q.get("hop_titles", [])]
            visible = any(contains(normalize_answer(obs), g) for g in p["gold"])
            c["questions"] += 1
            c["right"] += right
            c["hop1_passage_found"] += bool(hops and hops[0])
            c["every_hop_passage_found"] += bool(hops and all(hops))
            c["answer_visible"] += visible
            c["answer_visible_but_wrong"] += visible and not right
            c["right_without_visible_answer"] += right and not visible
            c[f"searches_{p['num_searches']}"] += 1
            # the hop-2 entity (its passage's title) named in the first observation, and then searched for
            first = re.search(r"<observation>(.*?)</observation>", p["trajectory"], re.S)
            queries = re.findall(r"<search>(.*?)</search>", p["trajectory"], re.S)
            hop2 = q.get("hop_titles", [None, None])[1] if len(q.get("hop_titles", [])) > 1 else None
            if hop2 and first and contains(normalize_answer(first.group(1)), hop2):
                c["hop2_named_in_first_observation"] += 1
                c["hop2_named_then_searched"] += len(queries) > 1 and contains(normalize_answer(queries[1]), hop2)
    print(json.dumps(dict(sorted(c.items()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
