"""Rollout engine throughput against plain batched generation and against a one-sample-at-a-time loop.

    python experiments/benchmarks/rollout.py [--batch 32] [--reps 3] [--seed 0]

Model: a random-init Qwen2-architecture model (4 layers, hidden 128) over the real Qwen2 vocabulary
(../shared/data), on CPU. Workload: every trajectory searches twice and then answers. A random model
never writes tags by itself, so a logits processor makes it: each turn the model samples freely for a
number of tokens drawn per trajectory and turn (uniform 16..64, end-of-sequence banned), then the tag text
(`<search>q</search>`, twice, then `<answer>x</answer>`) is forced token by token. The engine does
everything else for real: stop detection, a real BM25 search over a real Lucene index, observation
insertion, resumption.

* ``engine_vs_generate``: model tokens per second of the engine, divided by tokens per second of one plain
  batched ``model.generate`` of the same model and batch producing the same number of tokens per sequence
  (the engine's mean), with no stops (target >= 0.8);
* ``engine_vs_per_sample``: the engine over the batch, against the same engine run on one trajectory at a
  time (target >= 3).

Measurements are interleaved and repeated; medians are reported. The last line printed is one JSON object.

Why a batch of 32 by default: it is a GRPO rollout batch (4 questions x 8 generations; the quick start rolls out
64 per step). On a CPU the ratio to one-at-a-time decoding grows with the batch and is bounded by the model's
151,936 x 128 LM head: one row's step is memory-bound (~6 ms to stream the head's 78 MB), a batched step is
compute-bound, so a batch of 8 (whose rows also finish at different times) gains ~2.5x here where a GPU gains far
more. ``--batch 8`` measures that case; experiments/benchmarks/README.md records both.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from agentic_rag.data.prompts import build_prompt  # noqa: E402
from agentic_rag.data.world import generate_world, questions, write_world  # noqa: E402
from agentic_rag.rollout import AgentRollout, HFPolicy, RolloutSettings, SamplingParams  # noqa: E402
from agentic_rag.search import open_searcher  # noqa: E402
from agentic_rag.search.build import build_index  # noqa: E402

TAGS = ["<search>{q}</search>", "<search>{q} guild</search>", "<answer>{a}</answer>"]


class WorkloadPolicy(HFPolicy):
    """Samples freely for a planned number of tokens per turn, then forces the turn's tag text."""

    def __init__(self, model, tokenizer, plans: dict[str, list[int]], tags: dict[str, list[str]], **kw):
        super().__init__(model, tokenizer, SamplingParams(do_sample=True, temperature=1.0), processors=[self._force],
                         **kw)
        self.plans = plans
        self.tags = {k: [tokenizer(t, add_special_tokens=False)["input_ids"] for t in v] for k, v in tags.items()}
        self.turn_of: dict[int, tuple[int, list[int]]] = {}

    def _plan(self, row) -> tuple[int, list[int]]:
        key = hash(tuple(row.context[:row.turn_start]))  # the turn's context: stable across steps and sessions
        if key not in self.turn_of:
            text = self.tokenizer.decode(row.context[:row.turn_start])
            q = next(k for k in self.plans if k in text)
            n = text.split(q)[-1].count("</search>")  # turns done so far: one search each
            self.turn_of[key] = (self.plans[q][n], self.tags[q][n])
        return self.turn_of[key]

    def _force(self, scores, rows):
        for j, row in enumerate(rows):
            free, tag_ids = self._plan(row)
            step = len(row.generated)
            if step < free:
                scores[j, list(self.eos_ids)] = float("-inf")
            else:
                k = step - free
                token = tag_ids[k] if k < len(tag_ids) else min(self.eos_ids)
                scores[j].fill_(float("-inf"))
                scores[j, token] = 0.0
        return scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=str(ROOT.parent / "shared/data/rtp-llm-qwen-tokenizer/qwen2_tokenizer"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    torch.manual_seed(args.seed)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256,
                                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=4096, tie_word_embeddings=True)).eval()
    work = Path(tempfile.mkdtemp())
    paths = write_world(work / "world", seed=args.seed)
    build_index(paths["corpus"], work / "index", progress=False)
    searcher = open_searcher(work / "index", "bm25")
    _, test = questions(generate_world(args.seed))
    rows = test[: args.batch]
    rng = random.Random(args.seed)
    plans = {r["question"]: [rng.randint(16, 64) for _ in TAGS] for r in rows}
    person = {r["question"]: r["supporting_facts"][0] for r in rows}
    tags = {q: [t.format(q=person[q], a="x") for t in TAGS] for q in plans}
    prompts = [build_prompt(tok, q, chat=False) for q in plans]
    limits = RolloutSettings(max_tokens_per_turn=128, max_completion_tokens=2048, passages_per_search=2)

    def engine_run(idx: list[int]) -> tuple[int, float]:
        policy = WorkloadPolicy(model, tok, {q: plans[q] for q in (list(plans)[i] for i in idx)}, tags)
        engine = AgentRollout(policy, tok, searcher, limits)
        t0 = time.perf_counter()
        trajs = engine.run([prompts[i] for i in idx], [list(plans)[i] for i in idx])
        dt = time.perf_counter() - t0
        assert all(t.num_searches == 2 and t.finish_reason == "answer" for t in trajs), \
            [(t.finish_reason, t.num_searches) for t in trajs]
        return sum(t.model_tokens for t in trajs), dt

    tokens, _ = engine_run(list(range(len(prompts))))  # warm-up, and the token count
    engine_run([0])  # warm-up of the one-row shapes
    per_seq = round(tokens / len(prompts))

    def generate_run() -> tuple[int, float]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), tok.pad_token_id)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=per_seq,
                                 min_new_tokens=per_seq, pad_token_id=tok.pad_token_id, top_k=0, top_p=1.0)
        dt = time.perf_counter() - t0
        return (out.shape[1] - width) * len(prompts), dt

    eng, gen, single = [], [], []
    for _ in range(args.reps):
        n, dt = engine_run(list(range(len(prompts))))
        eng.append(n / dt)
        n, dt = generate_run()
        gen.append(n / dt)
        total_n = total_t = 0.0
        for i in range(len(prompts)):
            n, dt = engine_run([i])
            total_n += n
            total_t += dt
        single.append(total_n / total_t)
    e, g, s = statistics.median(eng), statistics.median(gen), statistics.median(single)
    print(json.dumps({"batch": len(prompts), "model_tokens_per_trajectory": per_seq, "searches_per_trajectory": 2,
                      "engine_tokens_per_s": round(e, 1), "generate_tokens_per_s": round(g, 1),
                      "per_sample_tokens_per_s": round(s, 1), "engine_vs_generate": round(e / g, 3),
                      "engine_vs_per_sample": round(e / s, 2)}))


if __name__ == "__main__":
    main()
