"""The training questions a policy answers wrong greedily: the ``cur`` recipes' training file (sweep.py).

GRPO's signal on the multi-hop group sits on questions greedy already answers (experiments/wiki/headroom.py);
training only on the misses, with large groups, puts every rollout where a right answer would change greedy.

    python3 greedy_misses.py PREDICTIONS TRAIN > .devdata/train_cur.jsonl

PREDICTIONS is ``agentic-rag eval``'s predictions.jsonl of the SFT adapter on TRAIN (greedy, one per question);
TRAIN is the quick start's data/train.jsonl. Prints the misses' TRAIN records in TRAIN's order, and their count
per kind on stderr. A question missing from PREDICTIONS is an error (a partial evaluation would bias the set).
"""

import collections
import json
import sys

predictions, train = sys.argv[1], sys.argv[2]
em = {}
with open(predictions, encoding="utf-8") as f:
    for line in f:
        p = json.loads(line)
        em[p["id"]] = p["metrics"]["em"]
kinds: collections.Counter = collections.Counter()
total: collections.Counter = collections.Counter()
with open(train, encoding="utf-8") as f:
    for line in f:
        r = json.loads(line)
        if r["id"] not in em:
            sys.exit(f"{r['id']} of {train} has no prediction in {predictions}: evaluate the whole file first")
        total[r["kind"]] += 1
        if em[r["id"]] < 1.0:
            kinds[r["kind"]] += 1
            sys.stdout.write(line)
print(json.dumps({k: f"{kinds[k]} of {total[k]}" for k in sorted(total)}), file=sys.stderr)
