"""The embedded default task: a generated fictional world that no model has seen.

People, guilds and towns with made-up names, linked by a few relations, written as short encyclopedia
passages; one-hop and two-hop questions whose answers exist only in those passages, so the only way to
answer is to search. Everything comes from a seed: the same seed gives the same world, byte for byte.

Relations: a person was *born in* a town and *works for* a guild; a guild is *based in* a town.
Questions:

* one-hop: "Where was Dovan Kell born?" (the person's passage), "Which guild does Dovan Kell work for?",
  "In which town is the Amber Lantern Guild based?" (the guild's passage);
* two-hop: "In which town is the guild that Dovan Kell works for based?" (the person's passage names the
  guild, the guild's passage names the town).

Train and test questions are about disjoint people, so a model cannot pass the test by remembering
training answers: it has to search. People share given and family names, so a held-out person's name is a
new combination of words the training names also use.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "th", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "k"]
_GUILD_WORDS = ["Amber", "Iron", "Copper", "Silver", "Ash", "Salt", "Cedar", "Willow", "Flint", "Hollow",
                "Lantern", "Anvil", "Harbor", "Quill", "Thistle", "Raven", "Ember", "Marble", "Tide", "Moss"]
_TOWN_SUFFIXES = ["ford", "holm", "wick", "mere", "stead", "vale", "bury", "port"]
_TRADES = ["weaver", "mason", "cartographer", "glassblower", "brewer", "archivist", "shipwright", "tanner"]


def _syllables(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(n))


@dataclass
class World:
    seed: int
    people: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> {born_in, works_for, trade}
    guilds: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> {based_in, founded}
    towns: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> {river}

    def passages(self) -> list[dict[str, str]]:
        out = []
        for name, p in self.people.items():
            out.append({"title": name, "text": f"{name} is a {p['trade']} who was born in {p['born_in']}. "
                                              f"{name} works for the {p['works_for']}."})
        for name, g in self.guilds.items():
            out.append({"title": name, "text": f"The {name} is based in {g['based_in']}. "
                                              f"It was founded in the year {g['founded']}."})
        for name, t in self.towns.items():
            out.append({"title": name, "text": f"{name} is a town on the river {t['river']}."})
        return [{"id": f"w{i}", **p} for i, p in enumerate(out)]


def _unique(rng: random.Random, make, taken: set[str]) -> str:
    while True:
        name = make(rng)
        if name not in taken:
            taken.add(name)
            return name


def generate_world(seed: int = 0, n_people: int = 240, n_guilds: int = 24, n_towns: int = 30) -> World:
    """A deterministic world; sizes are small enough to index and search in seconds."""
    if min(n_people, n_guilds, n_towns) < 4:
        raise ValueError("a world needs at least 4 people, guilds and towns")
    rng = random.Random(seed)
    taken: set[str] = set()
    world = World(seed=seed)
    towns = [_unique(rng, lambda r: _syllables(r, 2).capitalize() + r.choice(_TOWN_SUFFIXES), taken)
             for _ in range(n_towns)]
    rivers = [_unique(rng, lambda r: _syllables(r, 2).capitalize(), taken) for _ in range(n_towns)]
    for town, river in zip(towns, rivers, strict=True):
        world.towns[town] = {"river": river}
    for _ in range(n_guilds):
        name = _unique(rng, lambda r: " ".join(r.sample(_GUILD_WORDS, 2)) + " Guild", taken)
        world.guilds[name] = {"based_in": rng.choice(towns), "founded": str(rng.randint(1200, 1890))}
    guilds = list(world.guilds)
    # People share given names and family names (each pool about twice the square root of the population),
    # as in any town: a full name is unique, but every word of it also belongs to other people. A model
    # therefore cannot look a person up by one rare word, and the held-out people's names are made of words
    # the training questions also use.
    pool = max(4, round(2 * n_people ** 0.5))
    given = [_unique(rng, lambda r: _syllables(r, 2).capitalize(), taken) for _ in range(pool)]
    family = [_unique(rng, lambda r: _syllables(r, 1).capitalize(), taken) for _ in range(pool)]
    for _ in range(n_people):
        name = _unique(rng, lambda r: f"{r.choice(given)} {r.choice(family)}", taken)
        world.people[name] = {"born_in": rng.choice(towns), "works_for": rng.choice(guilds),
                              "trade": rng.choice(_TRADES)}
    return world


def _q(qid: str, question: str, answer: str, gold: list[str], hops: int, kind: str) -> dict:
    return {"id": qid, "question": question, "answer": answer, "supporting_facts": gold, "hops": hops,
            "type": kind}


def questions(world: World, *, test_fraction: float = 0.25) -> tuple[list[dict], list[dict]]:
    """Train and test questions over disjoint people (see the module docstring)."""
    rng = random.Random(world.seed + 1)
    people = list(world.people)
    rng.shuffle(people)
    n_test = max(1, int(len(people) * test_fraction))
    test, train = people[:n_test], people[n_test:]
    # every word of a held-out name also occurs in a training name (move the few exceptions to training)
    train_words = {w for name in train for w in name.split()}
    covered = [name for name in test if all(w in train_words for w in name.split())]
    train += [name for name in test if name not in covered]
    split = {"test": covered, "train": train}
    out: dict[str, list[dict]] = {"train": [], "test": []}
    for part, names in split.items():
        for i, name in enumerate(names):
            p = world.people[name]
            guild = p["works_for"]
            town = world.guilds[guild]["based_in"]
            choice = i % 4
            if choice == 0:
                q = _q(f"{part}-{i}", f"Where was {name} born?", p["born_in"], [name], 1, "born_in")
            elif choice == 1:
                q = _q(f"{part}-{i}", f"Which guild does {name} work for?", guild, [name], 1, "works_for")
            else:
                q = _q(f"{part}-{i}", f"In which town is the guild that {name} works for based?", town,
                       [name, guild], 2, "guild_town")
            out[part].append(q)
    return out["train"], out["test"]


def write_world(out_dir: str | os.PathLike, seed: int = 0, **sizes: int) -> dict[str, str]:
    """Write ``corpus.json`` (JSON list of passages), ``train.jsonl``, ``test.jsonl`` and ``world.json``."""
    from ..outputs import atomic_write_text, mark_dir

    world = generate_world(seed, **sizes)
    out = mark_dir(out_dir, "world")
    train, test = questions(world)
    paths = {"corpus": out / "corpus.json", "train": out / "train.jsonl", "test": out / "test.jsonl",
             "world": out / "world.json"}
    atomic_write_text(paths["corpus"], json.dumps(world.passages(), indent=0, ensure_ascii=False) + "\n")
    for name, rows in (("train", train), ("test", test)):
        atomic_write_text(paths[name], "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    atomic_write_text(paths["world"], json.dumps({"seed": seed, "people": world.people, "guilds": world.guilds,
                                                  "towns": world.towns}, indent=1, ensure_ascii=False) + "\n")
    return {k: str(v) for k, v in paths.items()}
