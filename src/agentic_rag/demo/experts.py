"""Scripted expert trajectories on the fictional world: the SFT warm start's data.

An expert searches for the entity the question names and answers from what came back. On two-hop
questions ("In which town is the guild that X works for based?") only a fraction of the expert
trajectories do the right thing - search the person, then search the guild the person's passage names,
then answer with the guild's town. The rest take a plausible shortcut: answer with the town the person's
passage mentions (where they were born), which is almost always wrong. A model fine-tuned on this mix
answers two-hop questions the shortcut way when decoding greedily, yet samples the two-search path often
enough for GRPO to find it and be rewarded for it: room to improve, and the improvement within reach.

The trajectories are produced by the real rollout engine (a scripted policy against the real index), so
prompts, observations and masks are exactly what training and evaluation will see.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..data.world import World


def expert_questions(world: World, people: Sequence[str], *, two_hop_correct: float, two_hop_samples: int = 3,
                     seed: int, dialect: str = "agentic") -> list[dict[str, Any]]:
    """Questions about ``people`` (every kind, and one per guild) with the turns an expert writes, in ``dialect``'s
    format.

    Each person's two-hop question comes ``two_hop_samples`` times, each time drawing afresh whether the
    expert searches twice: a model cannot learn the choice person by person, only its overall rate."""
    from ..rollout.protocol import get_dialect

    d = get_dialect(dialect)
    search, answer = d.write_search, d.write_answer
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for name in people:
        p = world.people[name]
        guild = p["works_for"]
        town = world.guilds[guild]["based_in"]
        rows.append({"question": f"Where was {name} born?", "answer": p["born_in"], "kind": "born_in",
                     "turns": [search(name), answer(p["born_in"])]})
        rows.append({"question": f"Which guild does {name} work for?", "answer": guild, "kind": "works_for",
                     "turns": [search(name), answer(guild)]})
        two = f"In which town is the guild that {name} works for based?"
        for _ in range(two_hop_samples):
            if rng.random() < two_hop_correct:
                rows.append({"question": two, "answer": town, "kind": "guild_town/two_searches",
                             "turns": [search(name), search(guild), answer(town)]})
            else:
                rows.append({"question": two, "answer": town, "kind": "guild_town/shortcut",
                             "turns": [search(name), answer(p["born_in"])], "written": p["born_in"]})
    for guild, g in world.guilds.items():
        rows.append({"question": f"In which town is the {guild} based?", "answer": g["based_in"],
                     "kind": "based_in", "turns": [search(guild), answer(g["based_in"])]})
    return rows


def write_expert_trajectories(rows: Sequence[dict[str, Any]], out: str | os.PathLike, *, tokenizer, searcher,
                              prompt_ids, settings) -> dict[str, Any]:
    """Play every row's turns through the rollout engine; write token-level trajectories (JSONL) for SFT.

    ``prompt_ids(question)`` builds a prompt the way training does; ``settings`` are the training config's rollout
    settings (:class:`~agentic_rag.rollout.settings.RolloutSettings`). Returns counts by kind, and how many
    trajectories did not end with the expert's answer (there should be none)."""
    from ..data.trajectories import play_scripts

    # the engine plays the scripts (agentic-rag trajectories does the same for question files)
    trajs = play_scripts(rows, tokenizer=tokenizer, searcher=searcher, prompt_ids=prompt_ids, settings=settings)
    kinds: dict[str, int] = {}
    wrong = 0
    unk = tokenizer.unk_token_id
    unknown_tokens = 0
    with open(out, "w", encoding="utf-8") as f:
        for r, t in zip(rows, trajs, strict=True):
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
            if t.answer is None or t.answer.strip() != r.get("written", r["answer"]):  # what the expert wrote
                wrong += 1
            unknown_tokens += sum(1 for i in t.prompt_ids + t.completion_ids if i == unk)
            f.write(json.dumps({"question": r["question"], "kind": r["kind"], "prompt_ids": t.prompt_ids,
                                "completion_ids": t.completion_ids, "env_mask": t.env_mask,
                                "text": t.text}) + "\n")
    return {"trajectories": len(rows), "by_kind": kinds, "not_ending_as_scripted": wrong,
            "unknown_tokens": unknown_tokens, "path": str(Path(out))}
