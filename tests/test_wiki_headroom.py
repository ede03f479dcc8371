"""experiments/wiki/headroom.py: what sampling finds that greedy misses, counted question by question."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_headroom_counts_greedy_misses_that_a_sample_answers(tmp_path):
    em = lambda x: {"metrics": {"em": x}}  # noqa: E731
    greedy = _write(tmp_path / "greedy.jsonl", [{"id": "a", **em(0.0)}, {"id": "b", **em(0.0)},
                                                {"id": "c", **em(1.0)}, {"id": "d", **em(1.0)}])
    sampled = _write(tmp_path / "sampled.jsonl", [
        {"id": "a", "samples": [em(0.0), em(1.0), em(1.0)]},  # greedy wrong, two samples right: headroom
        {"id": "b", "samples": [em(0.0), em(0.0), em(0.0)]},
        {"id": "c", "samples": [em(0.0), em(0.0), em(0.0)]},  # greedy right, no sample right
        {"id": "d", "samples": [em(1.0), em(0.0), em(1.0)]},
    ])
    script = ROOT / "experiments" / "wiki" / "headroom.py"
    proc = subprocess.run([sys.executable, str(script), str(greedy), str(sampled)], capture_output=True, text=True,
                          check=True)
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["questions"] == 4 and out["samples"] == [3] and out["greedy_right"] == 2
    assert out["greedy_wrong_some_sample_right"] == 1 and out["greedy_right_no_sample_right"] == 1
    assert out["table"] == {"greedy_wrong/0_samples_right": 1, "greedy_wrong/2_samples_right": 1,
                            "greedy_right/0_samples_right": 1, "greedy_right/2_samples_right": 1}
    # a sampled question the greedy file lacks is refused, not counted
    _write(sampled, [{"id": "z", "samples": [em(1.0)]}])
    bad = subprocess.run([sys.executable, str(script), str(greedy), str(sampled)], capture_output=True, text=True)
    assert bad.returncode != 0 and "question z" in bad.stderr
