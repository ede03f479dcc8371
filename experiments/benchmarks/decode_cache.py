"""The decoder's KV cache: Hugging Face's ``DynamicLayer`` (a ``torch.cat`` of the whole cache at every step) against
:class:`agentic_rag.rollout.kv_cache.ReservedLayer` (appends in place into reserved room), side by side.

    python experiments/benchmarks/decode_cache.py [--rows 64] [--prompt 400] [--new 48] [--repeats 3] [--turns 2]

The real SmolLM2-135M-Instruct decodes ``--rows`` rows greedily with :class:`~agentic_rag.rollout.decoding.
DecodeSession`: each row's prompt is ``--prompt`` tokens of a real 2Wiki passage (rows differ in length by up to a
quarter, as a rollout batch does), then ``--turns`` turns of ``--new`` tokens, each later turn after a 128-token
observation appended to the row (the wiki task's rollout: the cache grows by prefills and by single tokens). The two
variants alternate ``--repeats`` times in one process (the machine's load affects both alike); their generated
tokens must be identical. Reports each variant's median seconds, CPU seconds (user + system: system is the page
faults of fresh memory), minor page faults, and the ratio. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=400)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import torch

    from agentic_rag.malloc import release_freed_memory
    from agentic_rag.models import load_causal_lm, load_tokenizer
    from agentic_rag.rollout.decoding import DecodeSession, SamplingParams

    release_freed_memory()
    tok = load_tokenizer("smollm2-135m-instruct")
    model = load_causal_lm("smollm2-135m-instruct", device="cpu").eval()
    corpus = ROOT.parent / "shared" / "data" / "hipporag" / "2wikimultihopqa_corpus.json"
    texts = [p["text"] for p in json.loads(corpus.read_text())[:2000]]
    ids = tok(" ".join(texts), add_special_tokens=False)["input_ids"]
    prompts = [ids[i * 97:i * 97 + args.prompt - (i % 4) * args.prompt // 16] for i in range(args.rows)]
    observation = ids[-128:]

    def decode(reserve: int) -> tuple[list[list[int]], float, float, int]:
        s = DecodeSession(model, tok, stop_strings=[], eos_ids=set(), pad_id=tok.pad_token_id or 0,
                          sampling=SamplingParams(do_sample=False), return_logprobs=True, reserve=reserve)
        rows = [s.add(p, args.new) for p in prompts]
        out: dict[int, list[int]] = {r: [] for r in rows}
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        for turn in range(args.turns):
            if turn:
                for r in rows:
                    s.resume(r, observation, args.new)
            while s.busy:
                for r, gen in s.step():
                    out[r] += gen.ids
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return [out[r] for r in rows], wall, cpu, after.ru_minflt - before.ru_minflt

    results: dict[str, dict[str, list[float]]] = {"dynamic": {}, "reserved": {}}
    tokens = {}
    with torch.no_grad():
        for _ in range(args.repeats):
            for name, reserve in (("dynamic", 0), ("reserved", 64)):
                toks, wall, cpu, faults = decode(reserve)
                tokens[name] = toks
                for key, value in (("wall_s", wall), ("cpu_s", cpu), ("minor_faults", faults)):
                    results[name].setdefault(key, []).append(value)
                print(name, f"{wall:.1f} s wall, {cpu:.1f} s CPU, {faults} faults", flush=True)
    same = tokens["dynamic"] == tokens["reserved"]
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in results.items()}
    print(json.dumps({"rows": args.rows, "prompt_tokens": args.prompt, "new_tokens_per_turn": args.new,
                      "turns": args.turns, "repeats": args.repeats, "identical_tokens": same, "median": med,
                      "wall_ratio": round(med["reserved"]["wall_s"] / med["dynamic"]["wall_s"], 3),
                      "cpu_ratio": round(med["reserved"]["cpu_s"] / med["dynamic"]["cpu_s"], 3)}))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
