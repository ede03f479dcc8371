"""The user-slip case matrix (issue 29, "Nothing lost, nothing silent"): how every subcommand treats bad input.

Each case is one command a user could plausibly type with a slip in it -- a missing path, a folder where a file
is expected (or the reverse), an output path on top of an input, an output folder holding the user's own files,
a corrupt input, a bad value -- plus a few good-input controls. Every case runs in a fresh temporary directory
(its working directory) as a subprocess of the virtualenv's interpreter, ``nice -n 10``, with ``PYTHONPATH`` set
to the source tree under test and ``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1`` (so a hub name that does
not exist fails the same way on every machine; unset, it would be looked up online). The run records the exit
code, whether stderr holds a Python traceback or a Java stack, the number of stderr lines, the last meaningful
stderr line (log lines below WARNING, progress bars and Python warnings left out), the seconds taken and, for
cases with files of the user's in the way, whether those survived byte for byte (hashed before and after).

Verdicts, the worst first: ``lost files`` (a user file changed or vanished), ``timeout`` (no exit within the
case's limit), ``rc 0`` (bad input accepted: exit 0), ``served`` (a server started serving despite the bad
input), ``java stack``, ``traceback``, ``silent`` (non-zero exit without a word on stderr), ``unclear`` (a
refusal that leaves out what a case says it must name, e.g. the corrupt file, or that says what a case knows to
mislead, e.g. "install sentencepiece" for a folder that is not a model), ``control failed`` (a good-input
control did not succeed); ``ok`` otherwise. ``problems`` lists all that apply. A case expects
failure (non-zero exit), success (controls), serving (server controls), or either (an output folder holding
the user's files: working around them and refusing are both fine, as long as nothing is lost and a refusal
says why). The one HTTP case posts a form body (what ``curl -d`` sends) to a running search server: ``ok`` for
a 2xx, or a 4xx whose reason names JSON or the content type; ``unclear`` for another 4xx, ``http 500`` for 5xx.

Fixtures are built once, with the code under ``/work/main/src`` (``--fixture-src``), in a cache directory
(``--cache``; reused while its stamp matches, ``--rebuild-fixtures`` to start over), so that the before and
after runs see identical inputs: a small fictional world (``agentic-rag world``: corpus, questions), its BM25
index, a tiny random 2-layer Qwen2 model over the real Qwen tokenizer, a question file, an evaluation and a
training YAML, a finished evaluation run, SFT data, predictions to score and NQ records without answers. Cases
only read the fixtures; any case that damages something works on its own copy. The fixture tree is
fingerprinted before and after the run and a change is reported.

    python experiments/reliability/cases.py --src /work/base/src --out experiments/reliability/before.json
    python experiments/reliability/cases.py --src /work/main/src --out experiments/reliability/after.json
    python experiments/reliability/cases.py --src SRC --out r.json --only 'eval/*' [--jobs 1] [--update] [--list]
    python experiments/reliability/cases.py --table before.json after.json > table.md
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hostile  # noqa: E402  (round 4's cases and kinds, beside this file)

ROOT = HERE.parents[1]
PYTHON = ROOT / ".venv" / "bin" / "python"
SHARED = Path(os.environ.get("AGENTIC_RAG_SHARED_DATA", ROOT.parent / "shared" / "data"))
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "agentic-rag-reliability-fixtures"
FIXTURE_VERSION = 5  # 4: the settings-schema-2 YAML files beside the old ones; 5: an adapter, a finished run
DEFAULT_TIMEOUT = 90.0
NOTES = "my notes: do not lose these\n"

# the environment of every case: nothing inherited that could change what a command does
SCRUBBED_PREFIXES = ("AGENTIC_RAG_", "EVAL_", "JUDGE_", "SWANLAB_", "HF_", "TRANSFORMERS_", "OPENAI_", "PYTHON",
                     "MODEL_PATH", "INDEX_DIR", "WANDB_")

Setup = Callable[[Path, Path], None]  # (the case's working directory, the fixture directory)


@dataclass
class Case:
    id: str
    sub: str  # the subcommand, as a user types it
    cls: str  # control, missing, wrong-kind, out-over-in, out-over-user, corrupt, bad-value
    what: str  # one line: the slip
    args: str  # the command after the program, shell-quoted; {fx}, {port}, {dead} are filled in
    expect: str = "fail"  # fail | ok | either | serve | one (a race: one run finishes, the other is refused)
    prog: str = "cli"  # cli: agentic-rag; quickstart; chat: service/chat_server.py
    setup: Setup | None = None
    keep: tuple[str, ...] = ()  # the user's files (or folders) under the working directory that must survive
    kind: str = "run"  # run | server (polls {port}; serving = accepted) | http | round 4's (hostile.py)
    timeout: float = DEFAULT_TIMEOUT
    busy_port: bool = False  # the harness listens on {port} while the case runs
    names: str = ""  # regex: a refusal must say this (the file at fault, the option), else "unclear"
    misleads: str = ""  # regex: a refusal that says this points the user the wrong way: "unclear"


# ------------------------------------------------------------------------------------------------ setups


def put(rel: str, content: str | bytes) -> Setup:
    def f(tmp: Path, fx: Path) -> None:
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return f


def folder(rel: str) -> Setup:
    return lambda tmp, fx: (tmp / rel).mkdir(parents=True, exist_ok=True)


def copy(src: str, dst: str) -> Setup:
    """Copy the fixture ``src`` (relative to the fixture directory) to ``dst`` (relative to the case)."""
    def f(tmp: Path, fx: Path) -> None:
        s, d = fx / src, tmp / dst
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(s, d) if s.is_dir() else shutil.copy2(s, d)
    return f


def truncated(src: str, dst: str, keep_bytes: int = 150) -> Setup:
    """The first ``keep_bytes`` bytes of the fixture ``src``: a file cut off mid-record."""
    def f(tmp: Path, fx: Path) -> None:
        d = tmp / dst
        d.parent.mkdir(parents=True, exist_ok=True)
        d.write_bytes((fx / src).read_bytes()[:keep_bytes])
    return f


def broken_index(dst: str) -> Setup:
    """A copy of the BM25 index whose Lucene directory lacks a segment file (the terms dictionary)."""
    def f(tmp: Path, fx: Path) -> None:
        shutil.copytree(fx / "index", tmp / dst)
        for path in (tmp / dst / "bm25").glob("*.tim"):
            path.unlink()
    return f


def not_a_model(dst: str) -> Setup:
    """A folder that is not a model: the user's notes in it."""
    return put(f"{dst}/notes.txt", NOTES)


def seq(*steps: Setup) -> Setup:
    def f(tmp: Path, fx: Path) -> None:
        for step in steps:
            step(tmp, fx)
    return f


# ------------------------------------------------------------------------------------------------- cases

Q = "'Where was Midro Treth born?'"
EVAL = "eval --config {eval_yaml} --output-dir out --no-progress"
TRAIN_CHECK = "train --config {train_yaml} --check"
TRAIN = "train --config {train_yaml}"
SFT = "sft --model {fx}/model --data {fx}/sft.jsonl --batch-size 2 --max-length 256"
QS = "--tiny --seeds 1 --steps 1 --sft-epochs 0.1"
CHAT = "--device cpu --port {port}"
FOREIGN_PREDICTIONS = "".join(json.dumps({"question": f"q{i}", "answer": f"a{i}", "score": 0.5}) + "\n"
                              for i in range(3))
MISLEADS_MODEL = "sentencepiece or tiktoken"  # transformers' advice for a folder with no tokenizer files
FOREIGN_TRAIN = json.dumps({"question": "my own question", "answer": "mine"}) + "\n"


def build_cases() -> list[Case]:
    c: list[Case] = []
    add = c.append

    # corpus build ----------------------------------------------------------------------------------------
    s = "corpus build"
    add(Case("corpus-build/control", s, "control", "a corpus file -> passage JSONL",
             "corpus build --input {fx}/world/corpus.json --out out.jsonl", expect="ok"))
    add(Case("corpus-build/input-missing", s, "missing", "--input names no file",
             "corpus build --input nope.json --out out.jsonl"))
    add(Case("corpus-build/input-dir", s, "wrong-kind", "--input is a folder",
             "corpus build --input corpus_dir --out out.jsonl", setup=copy("world/corpus.json", "corpus_dir/c.json")))
    add(Case("corpus-build/out-dir", s, "wrong-kind", "--out is an existing folder (holding notes.txt)",
             "corpus build --input {fx}/world/corpus.json --out mydata", setup=put("mydata/notes.txt", NOTES),
             keep=("mydata/notes.txt",)))
    add(Case("corpus-build/out-is-input", s, "out-over-in", "--out is the --input file",
             "corpus build --input c.json --out c.json", setup=copy("world/corpus.json", "c.json"), keep=("c.json",)))
    add(Case("corpus-build/truncated-json", s, "corrupt", "--input is a JSON list cut off mid-record",
             "corpus build --input c.json --out out.jsonl", setup=truncated("world/corpus.json", "c.json")))
    add(Case("corpus-build/bad-jsonl-line", s, "corrupt", "a Pyserini JSONL corpus with one line that is not JSON",
             "corpus build --input c.jsonl --out out.jsonl",
             setup=put("c.jsonl", '{"id": "1", "contents": "\\"A\\"\\nfirst"}\n{"id": "2", "contents": \n'
                                  '{"id": "3", "contents": "\\"C\\"\\nthird"}\n')))
    add(Case("corpus-build/format-mismatch", s, "bad-value", "--format kilt for a title/text JSON list",
             "corpus build --input {fx}/world/corpus.json --format kilt --out out.jsonl", misleads="invalid JSON"))

    # index build -----------------------------------------------------------------------------------------
    s = "index build"
    add(Case("index-build/control", s, "control", "a corpus -> a BM25 index",
             "index build --corpus {fx}/world/corpus.json --out idx --bm25", expect="ok"))
    add(Case("index-build/corpus-missing", s, "missing", "--corpus names no file",
             "index build --corpus nope.json --out idx --bm25"))
    add(Case("index-build/corpus-dir", s, "wrong-kind", "--corpus is a folder (holding the corpus file)",
             "index build --corpus corpus_dir --out idx --bm25",
             setup=copy("world/corpus.json", "corpus_dir/corpus.json"), misleads="not found"))
    add(Case("index-build/out-file", s, "wrong-kind", "--out is an existing file of the user's",
             "index build --corpus {fx}/world/corpus.json --out index.txt --bm25", setup=put("index.txt", NOTES),
             keep=("index.txt",)))
    add(Case("index-build/out-holds-corpus", s, "out-over-in", "--out mydata, the folder the corpus is in",
             "index build --corpus mydata/corpus.json --out mydata --bm25",
             setup=copy("world/corpus.json", "mydata/corpus.json"), keep=("mydata/corpus.json",)))
    add(Case("index-build/out-is-corpus", s, "out-over-in", "--out is the corpus file itself",
             "index build --corpus c.json --out c.json --bm25", setup=copy("world/corpus.json", "c.json"),
             keep=("c.json",)))
    add(Case("index-build/out-user-folder", s, "out-over-user", "--out mydata holding notes.txt and the corpus",
             "index build --corpus mydata/corpus.json --out mydata --bm25",
             setup=seq(copy("world/corpus.json", "mydata/corpus.json"), put("mydata/notes.txt", NOTES)),
             keep=("mydata/notes.txt", "mydata/corpus.json")))
    add(Case("index-build/truncated-corpus", s, "corrupt", "the corpus JSON list is cut off",
             "index build --corpus c.json --out idx --bm25", setup=truncated("world/corpus.json", "c.json")))
    add(Case("index-build/unknown-encoder", s, "bad-value", "--dense-encoder names no encoder (offline hub)",
             "index build --corpus {fx}/world/corpus.json --out idx --dense-encoder no-such-encoder"))
    add(Case("index-build/k1-negative", s, "bad-value", "--k1 -1",
             "index build --corpus {fx}/world/corpus.json --out idx --bm25 --k1 -1"))

    # index link ------------------------------------------------------------------------------------------
    s = "index link"
    add(Case("index-link/control", s, "control", "link an existing Lucene index",
             "index link --out linked --lucene {fx}/index/bm25", expect="ok"))
    add(Case("index-link/lucene-missing", s, "missing", "--lucene names no folder",
             "index link --out linked --lucene nope"))
    add(Case("index-link/lucene-file", s, "wrong-kind", "--lucene is a file",
             "index link --out linked --lucene {fx}/world/corpus.json"))
    add(Case("index-link/lucene-not-index", s, "wrong-kind", "--lucene is a folder that is no index",
             "index link --out linked --lucene mydata", setup=put("mydata/notes.txt", NOTES),
             keep=("mydata/notes.txt",)))
    add(Case("index-link/lucene-missing-segment", s, "corrupt", "--lucene index lacks a segment file",
             "index link --out linked --lucene idx/bm25", setup=broken_index("idx")))
    add(Case("index-link/out-file", s, "wrong-kind", "--out is an existing file of the user's",
             "index link --out linked.txt --lucene {fx}/index/bm25", setup=put("linked.txt", NOTES),
             keep=("linked.txt",)))
    add(Case("index-link/out-user-folder", s, "out-over-user", "--out mydata holding notes.txt",
             "index link --out mydata --lucene {fx}/index/bm25", expect="either", setup=put("mydata/notes.txt", NOTES),
             keep=("mydata/notes.txt",)))

    # index info ------------------------------------------------------------------------------------------
    s = "index info"
    add(Case("index-info/control", s, "control", "print an index's manifest", "index info --index {fx}/index",
             expect="ok"))
    add(Case("index-info/missing", s, "missing", "--index names no folder", "index info --index nope"))
    add(Case("index-info/file", s, "wrong-kind", "--index is a file", "index info --index {fx}/world/corpus.json"))
    add(Case("index-info/not-index", s, "wrong-kind", "--index is a folder that is no index",
             "index info --index mydata", setup=put("mydata/notes.txt", NOTES)))
    add(Case("index-info/truncated-manifest", s, "corrupt", "the index's manifest.json is cut off",
             "index info --index idx", setup=seq(copy("index", "idx"), truncated("index/manifest.json",
                                                                                  "idx/manifest.json", 80))))

    # search ----------------------------------------------------------------------------------------------
    s = "search"
    add(Case("search/control-query", s, "control", "one query", "search --index {fx}/index -k 2 " + Q,
             expect="ok"))
    add(Case("search/control-queries", s, "control", "a question file -> hits JSONL",
             "search --index {fx}/index --queries {fx}/questions.jsonl --output hits.jsonl", expect="ok"))
    add(Case("search/index-missing", s, "missing", "--index names no folder", "search --index nope " + Q))
    add(Case("search/index-file", s, "wrong-kind", "--index is a file", "search --index {fx}/world/corpus.json " + Q))
    add(Case("search/queries-missing", s, "missing", "--queries names no file",
             "search --index {fx}/index --queries nope.jsonl --output hits.jsonl"))
    add(Case("search/queries-dir", s, "wrong-kind", "--queries is a folder",
             "search --index {fx}/index --queries qdir --output hits.jsonl",
             setup=copy("questions.jsonl", "qdir/questions.jsonl")))
    add(Case("search/output-is-queries", s, "out-over-in", "--output is the --queries file",
             "search --index {fx}/index --queries q.jsonl --output q.jsonl", setup=copy("questions.jsonl", "q.jsonl"),
             keep=("q.jsonl",)))
    add(Case("search/index-missing-segment", s, "corrupt", "the Lucene index lacks a segment file",
             "search --index idx " + Q, setup=broken_index("idx")))
    add(Case("search/k-0", s, "bad-value", "-k 0", "search --index {fx}/index -k 0 " + Q,
             misleads="Lucene could not answer|numHits"))
    add(Case("search/batch-size-negative", s, "bad-value", "--batch-size -1 with --queries",
             "search --index {fx}/index --queries {fx}/questions.jsonl --output hits.jsonl --batch-size -1"))
    add(Case("search/dense-on-bm25-index", s, "bad-value", "--retriever dense on a BM25-only index",
             "search --index {fx}/index --retriever dense " + Q))
    add(Case("search/dead-server", s, "bad-value", "--index is the URL of a server that is not running",
             "search --index http://127.0.0.1:{dead} " + Q))

    # eval-retrieval --------------------------------------------------------------------------------------
    s = "eval-retrieval"
    add(Case("eval-retrieval/control", s, "control", "recall@k of gold titles",
             "eval-retrieval --index {fx}/index --questions {fx}/world/test.jsonl --k 1,5", expect="ok"))
    add(Case("eval-retrieval/questions-missing", s, "missing", "--questions names no file",
             "eval-retrieval --index {fx}/index --questions nope.jsonl"))
    add(Case("eval-retrieval/questions-dir", s, "wrong-kind", "--questions is a folder",
             "eval-retrieval --index {fx}/index --questions qdir",
             setup=copy("questions.jsonl", "qdir/questions.jsonl")))
    add(Case("eval-retrieval/no-gold-titles", s, "corrupt", "NQ questions: no gold titles to measure recall of",
             "eval-retrieval --index {fx}/index --questions {fx}/nq.jsonl"))
    add(Case("eval-retrieval/k-0", s, "bad-value", "--k 0",
             "eval-retrieval --index {fx}/index --questions {fx}/world/test.jsonl --k 0"))
    add(Case("eval-retrieval/output-is-questions", s, "out-over-in", "--output is the --questions file",
             "eval-retrieval --index {fx}/index --questions q.jsonl --output q.jsonl",
             setup=copy("world/test.jsonl", "q.jsonl"), keep=("q.jsonl",)))

    # serve-search ----------------------------------------------------------------------------------------
    s = "serve-search"
    add(Case("serve-search/control", s, "control", "serve the index", "serve-search --index {fx}/index --port {port}",
             expect="serve", kind="server"))
    add(Case("serve-search/index-missing", s, "missing", "--index names no folder",
             "serve-search --index nope --port {port}", kind="server"))
    add(Case("serve-search/index-file", s, "wrong-kind", "--index is a file",
             "serve-search --index {fx}/world/corpus.json --port {port}", kind="server"))
    add(Case("serve-search/index-missing-segment", s, "corrupt", "the Lucene index lacks a segment file",
             "serve-search --index idx --port {port}", setup=broken_index("idx"), kind="server"))
    add(Case("serve-search/max-k-0", s, "bad-value", "--max-k 0 (every request would be refused)",
             "serve-search --index {fx}/index --port {port} --max-k 0", kind="server"))
    add(Case("serve-search/port-70000", s, "bad-value", "--port 70000",
             "serve-search --index {fx}/index --port 70000", kind="server"))
    add(Case("serve-search/workers-0", s, "bad-value", "--workers 0",
             "serve-search --index {fx}/index --port {port} --workers 0", kind="server"))
    add(Case("serve-search/port-busy", s, "bad-value", "--port is already in use",
             "serve-search --index {fx}/index --port {port}", kind="server", busy_port=True))
    add(Case("serve-search/http-form-body", s, "bad-value", "POST /search with curl -d's form content type",
             "serve-search --index {fx}/index --port {port}", expect="either", kind="http"))

    # eval ------------------------------------------------------------------------------------------------
    s = "eval"
    add(Case("eval/control", s, "control", "a tiny model on 2 questions", EVAL, expect="ok"))
    add(Case("eval/config-missing", s, "missing", "--config names no file",
             "eval --config nope.yaml --output-dir out --no-progress"))
    add(Case("eval/config-invalid-yaml", s, "corrupt", "--config is not valid YAML",
             "eval --config bad.yaml --output-dir out --no-progress", setup=put("bad.yaml", "policy: [unclosed\n")))
    add(Case("eval/dataset-missing", s, "missing", "dataset.path names no file",
             EVAL + " --set dataset.path=nope.jsonl"))
    add(Case("eval/dataset-no-answers", s, "corrupt", "NQ records without golden_answers",
             EVAL + " --set dataset.path={fx}/nq_no_gold.jsonl"))
    add(Case("eval/model-text-file", s, "wrong-kind", "policy.model is a text file",
             EVAL + " --set policy.model=model.txt", setup=put("model.txt", NOTES)))
    add(Case("eval/model-not-a-model", s, "corrupt", "policy.model is a folder that is not a model",
             EVAL + " --set policy.model=mymodel", setup=not_a_model("mymodel"), misleads=MISLEADS_MODEL))
    add(Case("eval/model-unknown-hub-name", s, "bad-value", "policy.model is a hub name that does not exist "
             "(HF_HUB_OFFLINE=1)", EVAL + " --set policy.model=nobody/no-such-model"))
    add(Case("eval/index-missing-segment", s, "corrupt", "search.index lacks a Lucene segment file",
             EVAL + " --set search.index=idx", setup=broken_index("idx")))
    add(Case("eval/dead-search-server", s, "bad-value", "search.index is the URL of a server that is not running",
             EVAL + " --set search.index=http://127.0.0.1:{dead}"))
    add(Case("eval/overwrite-model-fails", s, "out-over-user", "--overwrite over a finished run, and the model "
             "fails to load", EVAL + " --overwrite --set policy.model=mymodel",
             setup=seq(copy("eval_run", "out"), not_a_model("mymodel")),
             keep=("out/predictions.jsonl", "out/summary.json")))
    add(Case("eval/foreign-predictions", s, "out-over-user", "--output-dir holds a foreign predictions.jsonl "
             "(lines without id)", EVAL, setup=put("out/predictions.jsonl", FOREIGN_PREDICTIONS),
             keep=("out/predictions.jsonl",)))
    add(Case("eval/out-user-folder", s, "out-over-user", "--output-dir holds the user's notes.txt", EVAL,
             expect="either", setup=put("out/notes.txt", NOTES), keep=("out/notes.txt",)))
    add(Case("eval/out-is-dataset", s, "out-over-in", "--output-dir is the dataset file",
             "eval --config {eval_yaml} --set dataset.path=q.jsonl --output-dir q.jsonl --no-progress",
             setup=copy("questions.jsonl", "q.jsonl"), keep=("q.jsonl",)))
    add(Case("eval/search-k-0", s, "bad-value", "passages per search 0", EVAL + " --set {passages}=0"))

    # score -----------------------------------------------------------------------------------------------
    s = "score"
    add(Case("score/control", s, "control", "score a predictions file", "score --predictions {fx}/preds.jsonl",
             expect="ok"))
    add(Case("score/missing", s, "missing", "--predictions names no file", "score --predictions nope.jsonl"))
    add(Case("score/dir", s, "wrong-kind", "--predictions is a folder (a run's)", "score --predictions run",
             setup=copy("eval_run", "run")))
    add(Case("score/bad-json-line", s, "corrupt", "a line that is not JSON", "score --predictions p.jsonl",
             setup=put("p.jsonl", '{"prediction": "a", "gold": ["a"]}\n{"prediction": "b", "go\n'
                                  '{"prediction": "c", "gold": ["c"]}\n')))
    add(Case("score/no-gold", s, "corrupt", "records without any gold answer", "score --predictions p.jsonl",
             setup=put("p.jsonl", "".join(json.dumps({"id": str(i), "prediction": "x"}) + "\n" for i in range(3)))))
    add(Case("score/output-is-input", s, "out-over-in", "--output is the --predictions file",
             "score --predictions p.jsonl --output p.jsonl", setup=copy("preds.jsonl", "p.jsonl"),
             keep=("p.jsonl",)))

    # eval-report -----------------------------------------------------------------------------------------
    s = "eval-report"
    add(Case("eval-report/control", s, "control", "a report of one run", "eval-report --runs run --out report.md",
             expect="ok", setup=copy("eval_run", "run")))
    add(Case("eval-report/runs-missing", s, "missing", "--runs names no folder",
             "eval-report --runs nope --out report.md"))
    add(Case("eval-report/runs-not-a-run", s, "wrong-kind", "--runs is a folder without summary.json",
             "eval-report --runs mydata --out report.md", setup=put("mydata/notes.txt", NOTES)))
    add(Case("eval-report/corrupt-summary", s, "corrupt", "the run's summary.json is cut off",
             "eval-report --runs run --out report.md",
             setup=seq(copy("eval_run", "run"), truncated("eval_run/summary.json", "run/summary.json", 120)),
             names=r"summary\.json"))
    add(Case("eval-report/out-is-summary", s, "out-over-in", "--out is the run's summary.json",
             "eval-report --runs run --out run/summary.json", setup=copy("eval_run", "run"),
             keep=("run/summary.json", "run/predictions.jsonl")))
    add(Case("eval-report/out-is-predictions", s, "out-over-in", "--out is the run's predictions.jsonl",
             "eval-report --runs run --out run/predictions.jsonl", setup=copy("eval_run", "run"),
             keep=("run/summary.json", "run/predictions.jsonl")))
    add(Case("eval-report/names-mismatch", s, "bad-value", "two --names for one run",
             "eval-report --runs run --names a b --out report.md", setup=copy("eval_run", "run")))

    # world -----------------------------------------------------------------------------------------------
    s = "world"
    small = "--people 30 --guilds 4 --towns 5"
    add(Case("world/control", s, "control", "write a small world", f"world --out w {small}", expect="ok"))
    add(Case("world/out-user-folder", s, "out-over-user", "--out mydata holding notes.txt and the user's own "
             "train.jsonl", f"world --out mydata {small}", expect="either",
             setup=seq(put("mydata/notes.txt", NOTES), put("mydata/train.jsonl", FOREIGN_TRAIN)),
             keep=("mydata/notes.txt", "mydata/train.jsonl")))
    add(Case("world/out-file", s, "wrong-kind", "--out is an existing file of the user's", f"world --out w.txt {small}",
             setup=put("w.txt", NOTES), keep=("w.txt",)))
    add(Case("world/people-0", s, "bad-value", "--people 0", "world --out w --people 0 --guilds 4 --towns 5"))

    # train -----------------------------------------------------------------------------------------------
    s = "train"
    add(Case("train/control-check", s, "control", "--check of a good config", TRAIN_CHECK, expect="ok"))
    add(Case("train/control-run", s, "control", "one GRPO step of the tiny model", TRAIN, expect="ok"))
    add(Case("train/config-missing", s, "missing", "--config names no file (--check)",
             "train --config nope.yaml --check"))
    add(Case("train/config-invalid-yaml", s, "corrupt", "--config is not valid YAML (--check)",
             "train --config bad.yaml --check", setup=put("bad.yaml", "model: [unclosed\n")))
    add(Case("train/check-model-text-file", s, "wrong-kind", "--check, model.name_or_path is a text file",
             TRAIN_CHECK + " --set model.name_or_path=model.txt", setup=put("model.txt", NOTES)))
    add(Case("train/check-model-not-a-model", s, "corrupt", "--check, model.name_or_path is a folder that is not "
             "a model", TRAIN_CHECK + " --set model.name_or_path=mymodel", setup=not_a_model("mymodel")))
    add(Case("train/check-index-broken", s, "corrupt", "--check, search.index cannot open (a segment file missing)",
             TRAIN_CHECK + " --set search.index=idx", setup=broken_index("idx")))
    add(Case("train/index-broken", s, "corrupt", "search.index cannot open (a segment file missing), no --check",
             TRAIN + " --set search.index=idx", setup=broken_index("idx")))
    add(Case("train/check-train-file-dir", s, "wrong-kind", "--check, data.train_file is a folder",
             TRAIN_CHECK + " --set data.train_file=qdir", setup=copy("world/train.jsonl", "qdir/train.jsonl")))
    add(Case("train/check-no-answers", s, "corrupt", "--check, NQ training records without golden_answers",
             TRAIN_CHECK + " --set data.train_file={fx}/nq_no_gold.jsonl"))
    add(Case("train/resume-no-checkpoint", s, "bad-value", "--resume with no checkpoint to resume from",
             TRAIN + " --resume"))
    add(Case("train/check-lr-0", s, "bad-value", "--check, algorithm.learning_rate=0",
             TRAIN_CHECK + " --set algorithm.learning_rate=0"))
    add(Case("train/check-lr-negative", s, "bad-value", "--check, algorithm.learning_rate=-1",
             TRAIN_CHECK + " --set algorithm.learning_rate=-1"))
    add(Case("train/check-output-dir-file", s, "wrong-kind", "--check, checkpoint.output_dir is an existing file",
             TRAIN_CHECK + " --set checkpoint.output_dir=run.txt", setup=put("run.txt", NOTES), keep=("run.txt",)))
    add(Case("train/out-user-folder", s, "out-over-user", "checkpoint.output_dir holds the user's notes.txt",
             TRAIN + " --set checkpoint.output_dir=mydata", expect="either", setup=put("mydata/notes.txt", NOTES),
             keep=("mydata/notes.txt",)))

    # sft -------------------------------------------------------------------------------------------------
    s = "sft"
    add(Case("sft/control", s, "control", "LoRA SFT of the tiny model on 4 trajectories", SFT + " --out out",
             expect="ok"))
    add(Case("sft/data-missing", s, "missing", "--data names no file",
             "sft --model {fx}/model --data nope.jsonl --out out"))
    add(Case("sft/data-dir", s, "wrong-kind", "--data is a folder", "sft --model {fx}/model --data ddir --out out",
             setup=copy("sft.jsonl", "ddir/sft.jsonl")))
    add(Case("sft/out-file", s, "wrong-kind", "--out is an existing file of the user's", SFT + " --out out.txt",
             setup=put("out.txt", NOTES), keep=("out.txt",)))
    add(Case("sft/data-truncated", s, "corrupt", "--data is cut off mid-line",
             "sft --model {fx}/model --data d.jsonl --out out --batch-size 2 --max-length 256",
             setup=truncated("sft.jsonl", "d.jsonl", 100)))
    add(Case("sft/data-no-completion", s, "corrupt", "--data lines with a question and no completion",
             "sft --model {fx}/model --data d.jsonl --out out --batch-size 2 --max-length 256",
             setup=put("d.jsonl", json.dumps({"question": "Where was Midro Treth born?"}) + "\n")))
    add(Case("sft/model-text-file", s, "wrong-kind", "--model is a text file",
             "sft --model model.txt --data {fx}/sft.jsonl --out out", setup=put("model.txt", NOTES)))
    add(Case("sft/model-not-a-model", s, "corrupt", "--model is a folder that is not a model",
             "sft --model mymodel --data {fx}/sft.jsonl --out out", setup=not_a_model("mymodel"),
             misleads=MISLEADS_MODEL))
    add(Case("sft/lr-0", s, "bad-value", "--lr 0", SFT + " --out out --lr 0"))
    add(Case("sft/batch-size-negative", s, "bad-value", "--batch-size -1",
             "sft --model {fx}/model --data {fx}/sft.jsonl --out out --batch-size -1 --max-length 256"))
    add(Case("sft/out-user-folder", s, "out-over-user", "--out holds the user's notes.txt", SFT + " --out mydata",
             expect="either", setup=put("mydata/notes.txt", NOTES), keep=("mydata/notes.txt",)))
    add(Case("sft/full-out-is-model", s, "out-over-in", "--full with --out the --model folder",
             "sft --model m --data {fx}/sft.jsonl --out m --full --batch-size 2 --max-length 256", expect="either",
             setup=copy("model", "m"), keep=("m/model.safetensors", "m/config.json")))

    # estimate-memory -------------------------------------------------------------------------------------
    s = "estimate-memory"
    add(Case("estimate-memory/control", s, "control", "the tiny model's estimate",
             "estimate-memory --model {fx}/model --json", expect="ok"))
    add(Case("estimate-memory/model-missing", s, "missing", "--model names no folder",
             "estimate-memory --model ./no/such/model"))
    add(Case("estimate-memory/model-text-file", s, "wrong-kind", "--model is a text file",
             "estimate-memory --model model.txt", setup=put("model.txt", NOTES)))
    add(Case("estimate-memory/model-not-a-model", s, "corrupt", "--model is a folder that is not a model",
             "estimate-memory --model mymodel", setup=not_a_model("mymodel")))
    add(Case("estimate-memory/config-truncated", s, "corrupt", "--model's config.json is cut off",
             "estimate-memory --model m", setup=truncated("model/config.json", "m/config.json", 60)))
    add(Case("estimate-memory/unknown-hub-name", s, "bad-value", "--model is a hub name that does not exist "
             "(HF_HUB_OFFLINE=1)", "estimate-memory --model nobody/no-such-model"))
    add(Case("estimate-memory/gpus-0", s, "bad-value", "--gpus 0", "estimate-memory --model {fx}/model --gpus 0"))
    add(Case("estimate-memory/batch-negative", s, "bad-value", "--batch -1",
             "estimate-memory --model {fx}/model --batch -1"))

    # quick start -----------------------------------------------------------------------------------------
    s = "quickstart"
    add(Case("quickstart/control", s, "control", "the tiny quick start, 1 seed, 1 GRPO step",
             f"--out qs {QS}", expect="ok", prog="quickstart", timeout=240))
    add(Case("quickstart/out-user-folder", s, "out-over-user", "--out holds the user's notes.txt",
             f"--out mydata {QS}", expect="either", prog="quickstart", setup=put("mydata/notes.txt", NOTES),
             keep=("mydata/notes.txt",), timeout=240))
    add(Case("quickstart/out-file", s, "wrong-kind", "--out is an existing file of the user's", f"--out qs.txt {QS}",
             prog="quickstart", setup=put("qs.txt", NOTES), keep=("qs.txt",)))
    add(Case("quickstart/corrupt-settings", s, "corrupt", "--out is an earlier quick start whose settings.json is "
             "cut off", f"--out qs {QS}", prog="quickstart", setup=put("qs/settings.json", '{"world_seed": 0, "ti')))
    add(Case("quickstart/seeds-0", s, "bad-value", "--seeds 0", "--out qs --tiny --seeds 0", prog="quickstart"))
    add(Case("quickstart/steps-0", s, "bad-value", "--steps 0", "--out qs --tiny --seeds 1 --steps 0 --sft-epochs 0.1",
             prog="quickstart"))
    add(Case("quickstart/model-missing", s, "missing", "--model names a GGUF file that is not there",
             "--out qs --model /no/such/model.gguf --seeds 1 --steps 1", prog="quickstart"))

    # chat server -----------------------------------------------------------------------------------------
    s = "chat_server"
    add(Case("chat/control", s, "control", "serve the tiny model over the index",
             f"--model {{fx}}/model --index {{fx}}/index {CHAT}", expect="serve", prog="chat", kind="server"))
    add(Case("chat/model-missing", s, "missing", "--model names no folder",
             f"--model ./no/such/model --index {{fx}}/index {CHAT}", prog="chat", kind="server"))
    add(Case("chat/model-text-file", s, "wrong-kind", "--model is a text file",
             f"--model model.txt --index {{fx}}/index {CHAT}", prog="chat", kind="server",
             setup=put("model.txt", NOTES)))
    add(Case("chat/model-not-a-model", s, "corrupt", "--model is a folder that is not a model",
             f"--model mymodel --index {{fx}}/index {CHAT}", prog="chat", kind="server", setup=not_a_model("mymodel"),
             misleads=MISLEADS_MODEL))
    add(Case("chat/model-unknown-hub-name", s, "bad-value", "--model is a hub name that does not exist "
             "(HF_HUB_OFFLINE=1)", f"--model nobody/no-such-model --index {{fx}}/index {CHAT}", prog="chat",
             kind="server"))
    add(Case("chat/index-missing-segment", s, "corrupt", "--index lacks a Lucene segment file",
             f"--model {{fx}}/model --index idx {CHAT}", prog="chat", kind="server", setup=broken_index("idx")))
    add(Case("chat/port-70000", s, "bad-value", "--port 70000",
             "--model {fx}/model --index {fx}/index --device cpu --port 70000", prog="chat", kind="server"))
    add(Case("chat/max-batch-0", s, "bad-value", "--max-batch 0",
             f"--model {{fx}}/model --index {{fx}}/index {CHAT} --max-batch 0", prog="chat", kind="server"))
    add(Case("chat/dead-search-server", s, "bad-value", "--search-url of a server that is not running",
             f"--model {{fx}}/model {{search_url}} http://127.0.0.1:{{dead}} {CHAT}", prog="chat", kind="server"))
    c += hostile.cases(Case, put, copy, seq, NOTES, EVAL, TRAIN, TRAIN_CHECK, SFT, CHAT)
    return c


# -------------------------------------------------------------------------------------------------- fixtures

MODEL_SNIPPET = r"""
import shutil, sys, tempfile, torch
from pathlib import Path
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
shared, out = Path(sys.argv[1]), Path(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp:
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(shared / "rtp-llm-qwen-tokenizer" / "qwen2_tokenizer" / name, Path(tmp) / name)
    shutil.copy(shared / "rtp-llm-qwen-tokenizer" / "qwen3_30b_tokenizer_config" / "tokenizer_config.json",
                Path(tmp) / "tokenizer_config.json")
    tok = AutoTokenizer.from_pretrained(tmp)
torch.manual_seed(0)
config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                     tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
Qwen2ForCausalLM(config).save_pretrained(out)
tok.save_pretrained(out)
"""


def settings_schema(src: Path) -> int:
    """The config schema of the source tree under test: 2 from the one settings layer on (issue 30: sections
    rollout / prompt / sampling, `--index` for a search URL), 1 before it."""
    return 2 if (src / "agentic_rag" / "settings.py").is_file() else 1


def eval_yaml_v2(fx: Path) -> str:
    return f"""# the reliability cases' evaluation (settings schema 2): the tiny random model, 2 questions, a few tokens
name: tiny
dataset:
  path: {fx}/questions.jsonl
  limit: 2
policy:
  type: local
  model: {fx}/model
  device: cpu
search:
  index: {fx}/index
rollout:
  max_turns: 2
  max_searches: 1
  max_tokens_per_turn: 8
  max_completion_tokens: 48
  passages_per_search: 2
  max_observation_tokens: 32
batch_size: 2
metrics: [em, f1]
output_dir: run
"""


def train_yaml_v2(fx: Path) -> str:
    return train_yaml(fx).replace("{name: exact_match,", "{name: em,").replace(
        "# the reliability cases' training run:", "# the reliability cases' training run (settings schema 2):")


def eval_yaml(fx: Path) -> str:
    return f"""# the reliability cases' evaluation: the tiny random model, 2 questions, a few tokens
name: tiny
dataset:
  path: {fx}/questions.jsonl
  limit: 2
policy:
  type: local
  model: {fx}/model
  device: cpu
  temperature: 0.0
search:
  index: {fx}/index
  k: 2
rollout:
  max_turns: 2
  max_searches: 1
  max_tokens_per_turn: 8
  max_completion_tokens: 48
  max_observation_tokens: 32
  batch_size: 2
metrics: [em, f1]
output_dir: run
"""


def train_yaml(fx: Path) -> str:
    return f"""# the reliability cases' training run: one GRPO step of the tiny random model, nothing logged
model:
  name_or_path: {fx}/model
  lora_r: 4
  lora_alpha: 8
  gradient_checkpointing: false
  dtype: float32
data:
  train_file: {fx}/world/train.jsonl
search:
  index: {fx}/index
rollout:
  max_turns: 2
  max_searches: 1
  max_tokens_per_turn: 8
  max_completion_tokens: 32
  passages_per_search: 1
  max_observation_tokens: 24
rewards:
  - {{name: exact_match, weight: 1.0}}
algorithm:
  name: grpo
  num_generations: 2
  per_device_train_batch_size: 2
  max_steps: 1
logging:
  swanlab_mode: disabled
checkpoint:
  output_dir: trainrun
  save_steps: 1
seed: 0
"""


def case_env(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
    env.update(PYTHONPATH=str(src), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", AGENTIC_RAG_CACHE="off")
    return env


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (or of ``root`` itself), by path relative to it."""
    if root.is_file():
        return {".": hashlib.sha256(root.read_bytes()).hexdigest()}
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def build_fixtures(cache: Path, fixture_src: Path, python: Path, rebuild: bool) -> Path:
    """The fixture directory (built with ``fixture_src`` unless a matching one is there already)."""
    fx = cache / f"v{FIXTURE_VERSION}"
    stamp = fx / "stamp.json"
    if stamp.is_file() and not rebuild:
        return fx
    shutil.rmtree(fx, ignore_errors=True)
    fx.mkdir(parents=True)
    env = case_env(fixture_src)

    def run(*argv: str) -> None:
        proc = subprocess.run([str(python), *argv], cwd=fx, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"fixture step failed: {' '.join(argv)}\n{proc.stderr[-3000:]}")

    print(f"building fixtures in {fx} with {fixture_src}", file=sys.stderr)
    cli = ("-m", "agentic_rag.cli", "--log-level", "WARNING")
    run(*cli, "world", "--out", "world", "--people", "30", "--guilds", "4", "--towns", "5")
    run(*cli, "index", "build", "--corpus", "world/corpus.json", "--out", "index", "--bm25")
    run("-c", MODEL_SNIPPET, str(SHARED), str(fx / "model"))
    test = (fx / "world" / "test.jsonl").read_text().splitlines()
    (fx / "questions.jsonl").write_text("\n".join(test[:3]) + "\n")
    train = [json.loads(line) for line in (fx / "world" / "train.jsonl").read_text().splitlines()[:4]]
    with open(fx / "sft.jsonl", "w") as f:
        for r in train:
            completion = (f"<search>{r['question']}</search> <observation>(1) {r['supporting_facts'][0]}"
                          f"</observation> <answer>{r['answer']}</answer>")
            f.write(json.dumps({"question": r["question"], "completion": completion}) + "\n")
    with open(fx / "preds.jsonl", "w") as f:
        for i, r in enumerate(train):
            f.write(json.dumps({"id": r["id"], "prediction": r["answer"] if i % 2 else "nobody",
                                "golden_answers": [r["answer"]]}) + "\n")
    nq = [json.loads(line) for line in (SHARED / "flashrag" / "nq_test.jsonl").read_text().splitlines()[:3]]
    (fx / "nq.jsonl").write_text("".join(json.dumps(r) + "\n" for r in nq))
    (fx / "nq_no_gold.jsonl").write_text("".join(
        json.dumps({k: v for k, v in r.items() if k != "golden_answers"}) + "\n" for r in nq))
    (fx / "eval.yaml").write_text(eval_yaml(fx))
    (fx / "train.yaml").write_text(train_yaml(fx))
    (fx / "eval-v2.yaml").write_text(eval_yaml_v2(fx))
    (fx / "train-v2.yaml").write_text(train_yaml_v2(fx))
    v2 = settings_schema(fixture_src) == 2
    run(*cli, "eval", "--config", "eval-v2.yaml" if v2 else "eval.yaml", "--output-dir", str(fx / "eval_run"),
        "--no-progress")
    run("-c", hostile.ADAPTER_SNIPPET, str(fx / "model"), str(fx / "adapter"))
    run(*cli, "train", "--config", "train-v2.yaml" if v2 else "train.yaml", "--set",
        f"checkpoint.output_dir={fx / 'train_run'}")
    stamp.write_text(json.dumps({"version": FIXTURE_VERSION, "src": str(fixture_src),
                                 "built": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1) + "\n")
    return fx


# ------------------------------------------------------------------------------------------------ running


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def program(case: Case, src: Path, python: Path) -> list[str]:
    if case.prog == "cli":
        return [str(python), "-m", "agentic_rag.cli"]
    if case.prog == "quickstart":
        return [str(python), "-m", "agentic_rag.demo.quickstart"]
    if case.prog == "chat":
        return [str(python), str(src.parent / "service" / "chat_server.py")]
    if case.prog == "eval.sh":
        return ["bash", str(src.parent / "script" / "evaluation" / "eval.sh")]
    raise ValueError(case.prog)


def display(argv: list[str], src: Path, python: Path, fx: Path) -> str:
    text = shlex.join(argv)
    for long, short in ((str(src.parent / "service"), "service"), (str(python), "python"), (str(fx), "$FX"),
                        (str(src), "$SRC")):
        text = text.replace(long, short)
    return text.replace("python -m agentic_rag.cli", "agentic-rag")


NOISE = [re.compile(p) for p in (
    r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]?\d* +(INFO|DEBUG) ",  # the product's log lines below WARNING
    r"^\[\d{4}-[^\]]*\] \[(INFO|DEBUG|WARNING)\]",  # DeepSpeed's accelerator notices
    r"^INFO:? ",  # uvicorn
    r"\d+%\|", r"\|\s*\d+/\d+ \[",  # progress bars
    r"^\s*warnings\.warn\(", r"^\S.*\.py:\d+: \w*Warning: ",  # Python warnings
    r"swigfaiss_avx(2|512)",  # the continuations of faiss's INFO lines about its AVX builds
)]
# a frame of a Java stack as the JVM (``at ...``) or pyjnius (a bare frame per line) prints it
JAVA_FRAME = re.compile(r"^\s*(at\s+)?[\w$/]+(\.[\w$<>/]+)+\((\w+\.java:\d+|Unknown Source|Native Method)\)\s*$")
JAVA_NOISE = re.compile(r"^\s*(Caused by:?|\.\.\. \d+ more)\s*$")


def java_stack(stderr: str) -> bool:
    return "Exception in thread" in stderr or any(JAVA_FRAME.match(line) for line in stderr.splitlines())


def meaningful(stderr: str) -> list[str]:
    lines = []
    for raw in stderr.replace("\r", "\n").split("\n"):
        line = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", raw).strip()
        if re.search(r"\w", line) and not any(p.search(line) for p in NOISE) and not JAVA_FRAME.match(line) \
                and not JAVA_NOISE.match(line):
            lines.append(line)
    return lines


CASE_DIR = re.compile(r"/[\w./-]*?/reliability-case-\w+/work(/|\b)")


def shorten(text: str, fx: Path | str | None = None, src: Path | str | None = None) -> str:
    """Paths in what a case printed made short: the fixtures as $FX, the case's own directory dropped."""
    text = CASE_DIR.sub(lambda m: "" if m.group(1) == "/" else ".", text)
    if fx:
        text = text.replace(str(fx), "$FX")
    if src:
        text = text.replace(str(src), "$SRC")
    return text


def run_process(argv: list[str], cwd: Path, env: dict[str, str], timeout: float, logs: Path,
                serve_port: int | None) -> dict[str, Any]:
    """Run ``argv``; with ``serve_port``, stop it as soon as something listens there (it served)."""
    out_path, err_path = logs / "stdout", logs / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(["nice", "-n", "10", *argv], cwd=cwd, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        served = timed_out = False
        err_at_serve = None
        while proc.poll() is None:
            if time.monotonic() > deadline:
                timed_out = True
                break
            if serve_port is not None and port_open(serve_port):
                served = True
                time.sleep(0.5)  # let the "serving" line reach the log
                err_at_serve = err_path.stat().st_size
                break
            time.sleep(0.3)
        hostile.stop(proc)
    stderr = err_path.read_bytes()
    if err_at_serve is not None:
        stderr = stderr[:err_at_serve]  # what it said until it served, not its shutdown
    return {"rc": None if (served or timed_out) else proc.returncode, "served": served, "timed_out": timed_out,
            "stderr": stderr.decode(errors="replace"), "stdout": out_path.read_bytes().decode(errors="replace")}


def run_http(argv: list[str], cwd: Path, env: dict[str, str], timeout: float, logs: Path,
             port: int) -> dict[str, Any]:
    """Start the search server, POST /search with a form content type (curl -d's default), stop it."""
    out_path, err_path = logs / "stdout", logs / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(["nice", "-n", "10", *argv], cwd=cwd, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        status, body, timed_out = None, "", False
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status != 200:
                            continue
                except OSError:
                    time.sleep(0.3)
                    continue
                req = urllib.request.Request(f"http://127.0.0.1:{port}/search", method="POST",
                                             data=b'{"query": "Where was Midro Treth born?", "k": 2}',
                                             headers={"Content-Type": "application/x-www-form-urlencoded"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        status, body = r.status, r.read().decode(errors="replace")
                except urllib.error.HTTPError as exc:
                    status, body = exc.code, exc.read().decode(errors="replace")
                break
        finally:
            hostile.stop(proc)
    return {"rc": proc.returncode if status is None and not timed_out else None, "served": status is not None,
            "timed_out": timed_out, "http_status": status, "http_body": body[:300],
            "stderr": err_path.read_bytes().decode(errors="replace"),
            "stdout": out_path.read_bytes().decode(errors="replace")}


def verdict_of(case: Case, res: dict[str, Any], lost: list[str]) -> tuple[str, list[str]]:
    own = hostile.verdict(case, res, lost)
    if own is not None:
        return own
    problems = []
    rc, served, timed_out = res["rc"], res["served"], res["timed_out"]
    if lost:
        problems.append("lost files")
    if timed_out:
        problems.append("timeout")
    if case.kind == "http":
        status, body = res.get("http_status"), (res.get("http_body") or "").lower()
        if status is None and not timed_out:
            problems.append("control failed")  # the server never came up
        elif status is not None and status >= 500:
            problems.append("http 500")
        elif status is not None and status >= 300 and not ("json" in body or "content-type" in body):
            problems.append("unclear")
        return (problems[0] if problems else "ok"), problems
    if case.expect == "fail":
        if served:
            problems.append("served")
        elif rc == 0:
            problems.append("rc 0")
    elif case.expect == "ok" and not timed_out and rc != 0:
        problems.append("control failed")
    elif case.expect == "serve" and not served and not timed_out:
        problems.append("control failed")
    if res["java_stack"]:
        problems.append("java stack")
    if res["traceback"]:
        problems.append("traceback")
    if case.expect in ("fail", "either") and rc not in (0, None) and not res["last_line"]:
        problems.append("silent")
    elif rc not in (0, None) and ((case.names and not re.search(case.names, res["stderr_tail"]))
                                  or (case.misleads and re.search(case.misleads, res["stderr_tail"]))):
        problems.append("unclear")
    return (problems[0] if problems else "ok"), problems


def run_case(case: Case, src: Path, python: Path, fx: Path) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="reliability-case-"))
    work, logs = base / "work", base / "logs"
    work.mkdir()
    logs.mkdir()
    busy = disk = None
    try:
        if case.kind in ("disk-ro", "disk-full"):
            disk = work / "disk"
            why = hostile.mount_disk(disk, read_only=case.kind == "disk-ro")
            if why is not None:
                disk = None
                return {"id": case.id, "subcommand": case.sub, "class": case.cls, "what": case.what,
                        "expect": case.expect, "command": case.args, "rc": None, "verdict": "skipped",
                        "problems": [why], "skipped": why, "last_line": "", "stdout_last": "", "lost": [],
                        "files_intact": None, "seconds": 0.0}
        if case.setup is not None:
            case.setup(work, fx)
        before = {f"{k}/{p}" if p != "." else k: d for k in case.keep for p, d in tree_digest(work / k).items()}
        port, dead = free_port(), free_port()
        v2 = settings_schema(src) == 2
        fill = {"{fx}": str(fx), "{port}": str(port), "{dead}": str(dead),
                "{eval_yaml}": str(fx / ("eval-v2.yaml" if v2 else "eval.yaml")),
                "{train_yaml}": str(fx / ("train-v2.yaml" if v2 else "train.yaml")),
                "{search_url}": "--index" if v2 else "--search-url",
                "{passages}": "rollout.passages_per_search" if v2 else "search.k"}
        argv = program(case, src, python)
        for tok in shlex.split(case.args):
            for key, value in fill.items():
                tok = tok.replace(key, value)
            argv.append(tok)
        if case.busy_port:
            busy = socket.socket()
            busy.bind(("127.0.0.1", port))
            busy.listen(8)
        started = time.perf_counter()
        env = case_env(src)
        if case.prog == "eval.sh":  # the wrapper finds the interpreter under test through PYTHON
            env.update(PYTHON=str(python), AGENTIC_RAG_NO_VENV="1", ENV_FILE="/dev/null")
        if case.kind == "http":
            res = run_http(argv, work, env, case.timeout, logs, port)
        elif case.kind == "race":
            res = hostile.run_race(argv, work, env, case.timeout, logs)
        elif case.kind == "tokens":
            res = hostile.run_tokens(case.args, python, work, env, case.timeout, fx, logs)
        elif case.kind == "big-body":
            res = hostile.run_big_body(argv, work, env, case.timeout, logs, port)
        elif case.kind == "slow-head":
            res = hostile.run_slow_head(argv, work, env, case.timeout, logs, port)
        else:
            res = run_process(argv, work, env, case.timeout, logs,
                              port if case.kind == "server" and not case.busy_port else None)
        seconds = time.perf_counter() - started
        after = {f"{k}/{p}" if p != "." else k: d for k in case.keep if (work / k).exists()
                 for p, d in tree_digest(work / k).items()}
        lost = sorted(p for p in before if after.get(p) != before[p])
        if case.keep and not before:
            lost = list(case.keep)  # the setup made nothing to keep: a broken case, shown as such
        stderr = shorten(res.pop("stderr"), fx, src)
        stdout = shorten(res.pop("stdout"), fx, src)
        if "http_body" in res:
            res["http_body"] = shorten(res["http_body"], fx, src)
        lines = meaningful(stderr)
        res.update(traceback="Traceback (most recent call last)" in stderr,
                   java_stack=java_stack(stderr),
                   stderr_lines=len(stderr.splitlines()), meaningful_lines=len(lines),
                   last_line=(lines[-1][:160] if lines else ""),
                   stdout_last=(meaningful(stdout)[-1][:160] if meaningful(stdout) else ""),
                   stderr_tail="\n".join(line[:300] for line in lines[-12:]))
        verdict, problems = verdict_of(case, res, lost)
        return {"id": case.id, "subcommand": case.sub, "class": case.cls, "what": case.what, "expect": case.expect,
                "command": display(argv, src, python, fx), **res, "verdict": verdict, "problems": problems,
                "files_intact": (not lost) if case.keep else None, "lost": lost, "seconds": round(seconds, 1)}
    finally:
        if busy is not None:
            busy.close()
        if disk is not None:
            hostile.unmount_disk(disk)
        shutil.rmtree(base, ignore_errors=True)


def selected(cases: list[Case], pattern: str | None) -> list[Case]:
    """The cases whose id contains one of the comma-separated patterns (or matches it, with * ? [); ``round4``: the
    classes of issue 56 (:mod:`hostile`)."""
    if not pattern:
        return cases
    pats = [p.strip() for p in pattern.split(",") if p.strip()]

    def match(c: Case, p: str) -> bool:
        if p == "round4":
            return c.cls in hostile.CLASSES
        return fnmatch.fnmatch(c.id, p) if any(ch in p for ch in "*?[") else p in c.id

    return [c for c in cases if any(match(c, p) for p in pats)]


def check_src(src: Path, python: Path) -> None:
    proc = subprocess.run([str(python), "-c", "import agentic_rag; print(agentic_rag.__file__)"],
                          env=case_env(src), capture_output=True, text=True)
    found = Path(proc.stdout.strip() or "?").resolve()
    if proc.returncode != 0 or src.resolve() not in found.parents:
        raise SystemExit(f"PYTHONPATH={src} does not give its own agentic_rag (got {found}): {proc.stderr[-500:]}")


def run_all(args: argparse.Namespace) -> int:
    src, python = Path(args.src).resolve(), Path(args.python)
    cases = selected(build_cases(), args.only)
    if not cases:
        raise SystemExit(f"no case matches {args.only!r}")
    check_src(src, python)
    fx = build_fixtures(Path(args.cache), Path(args.fixture_src).resolve(), python, args.rebuild_fixtures)
    fx_before = tree_digest(fx)
    started, started_at = time.perf_counter(), time.strftime("%Y-%m-%d %H:%M:%S")
    records: list[dict[str, Any] | None] = [None] * len(cases)

    def one(i: int) -> None:
        rec = run_case(cases[i], src, python, fx)
        records[i] = rec
        print(f"[{i + 1:>3}/{len(cases)}] {rec['id']:<44} {rec['verdict']:<14} rc={rec['rc']} "
              f"{rec['seconds']:>6.1f}s  {(rec['last_line'] or rec['stdout_last'])[:90]}", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, range(len(cases))))
    fx_after = tree_digest(fx)
    changed = sorted(p for p in fx_before.keys() | fx_after.keys() if fx_before.get(p) != fx_after.get(p))
    if changed:
        print(f"WARNING: cases changed the fixtures: {changed[:10]}", file=sys.stderr)
    done = [r for r in records if r is not None]
    meta = {"src": str(src), "python": str(python), "fixtures": str(fx), "fixture_src": args.fixture_src,
            "env": "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 AGENTIC_RAG_CACHE=off, nice -n 10",
            "started": started_at, "seconds": round(time.perf_counter() - started, 1), "fixtures_changed": changed}
    if args.update and Path(args.out).is_file():  # splice these cases into an earlier run's results
        earlier = json.loads(Path(args.out).read_text())
        fresh = {r["id"]: r for r in done}
        order = {c.id: i for i, c in enumerate(build_cases())}
        merged = {r["id"]: r for r in load_records(args.out)} | fresh
        done = sorted(merged.values(), key=lambda r: order.get(r["id"], len(order)))
        print(f"replaced {len(fresh)} of the {len(done)} cases in {args.out}", file=sys.stderr)
        if isinstance(earlier, dict):  # the full run's meta, with this rerun noted
            rerun = {"started": started_at, "seconds": meta["seconds"], "cases": sorted(fresh),
                     "fixtures_changed": changed}
            meta = {**earlier.get("meta", {}), "reruns": [*earlier.get("meta", {}).get("reruns", []), rerun]}
    meta["verdicts"] = dict(Counter(r["verdict"] for r in done))
    out = {"meta": meta, "cases": done}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["meta"]["verdicts"]), file=sys.stderr)
    return 0


# -------------------------------------------------------------------------------------------------- table


def load_records(path: str) -> list[dict[str, Any]]:
    data = json.loads(Path(path).read_text())
    return data["cases"] if isinstance(data, dict) else data


def cell(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "-"
    rc = "served" if rec.get("served") and rec.get("rc") is None else f"rc {rec.get('rc')}"
    if rec.get("rcs") is not None:  # a race: both runs' exit codes
        rc = f"rc {rec['rcs'][0]} and {rec['rcs'][1]}"
    if rec.get("tokens"):
        line = json.dumps(rec["tokens"])
    elif "rss_growth_mb" in rec:
        line = f"HTTP {rec.get('http_status')}, peak RSS +{rec['rss_growth_mb']} MB"
    elif "dropped_after_s" in rec:
        dropped = rec["dropped_after_s"]
        line = f"dropped after {dropped} s" if dropped is not None else "still open after 40 s"
    elif rec.get("http_status") is not None:
        rc = f"HTTP {rec['http_status']}"
        line = rec.get("http_body") or ""
    else:
        line = rec.get("last_line") or (f"stdout: {rec['stdout_last']}" if rec.get("stdout_last") else "")
    line = shorten(line).replace("|", "\\|").replace("`", "'")[:110]
    lost = f" lost: {', '.join(rec['lost'])}" if rec.get("lost") else ""
    return f"**{rec['verdict']}** ({rc}){lost}" + (f" `{line}`" if line else "")


def iter_rows(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> Iterator[tuple[dict, dict | None]]:
    by_id = {r["id"]: r for r in after}
    seen = set()
    for r in before:
        seen.add(r["id"])
        yield r, by_id.get(r["id"])
    for r in after:
        if r["id"] not in seen:
            yield r, r


def table(before_path: str, after_path: str | None, ids: set[str] | None = None) -> str:
    """The before/after table, of the cases ``ids`` only when given (``--only``)."""
    before = [r for r in load_records(before_path) if ids is None or r["id"] in ids]
    after = [r for r in load_records(after_path) if ids is None or r["id"] in ids] if after_path else []
    out = []
    for name, recs in (("before", before), ("after", after)):
        if recs:
            counts = Counter(r["verdict"] for r in recs)
            out.append(f"- {name}: {len(recs)} cases: " + ", ".join(f"{v} {n}" for v, n in counts.most_common()))
    out += ["", "| subcommand | class | case | before | after |", "| --- | --- | --- | --- | --- |"]
    whats = {c.id: c.what for c in build_cases()}  # the case as it reads now (a record keeps the words of its day)
    for b, a in iter_rows(before, after):
        only_after = a is b and after_path
        case = f"`{b['id'].split('/', 1)[-1]}`: {whats.get(b['id'], b['what'])}".replace("|", "\\|")
        out.append(f"| {b['subcommand']} | {b['class']} | {case} | {'-' if only_after else cell(b)} | "
                   f"{cell(a) if after_path else ''} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", help="the source tree under test (PYTHONPATH), e.g. /work/base/src")
    ap.add_argument("--out", help="results JSON")
    ap.add_argument("--only", default=None,
                    help="comma-separated patterns: case ids containing one (or matching it, with * ? [)")
    ap.add_argument("--jobs", type=int, default=1, help="cases at a time (default 1)")
    ap.add_argument("--python", default=str(PYTHON), help="the interpreter (default: the project's venv)")
    ap.add_argument("--cache", default=str(DEFAULT_CACHE), help="fixture cache directory")
    ap.add_argument("--fixture-src", default=str(ROOT / "src"), help="the source tree that builds the fixtures")
    ap.add_argument("--rebuild-fixtures", action="store_true")
    ap.add_argument("--update", action="store_true",
                    help="keep the other cases of an existing --out file and replace only the ones run now")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="BEFORE.json [AFTER.json]: print a markdown table")
    args = ap.parse_args(argv)
    if args.table:
        if len(args.table) > 2:
            ap.error("--table takes BEFORE.json and optionally AFTER.json")
        sys.stdout.write(table(args.table[0], args.table[1] if len(args.table) > 1 else None,
                               {c.id for c in selected(build_cases(), args.only)} if args.only else None))
        return 0
    if args.list:
        cases = selected(build_cases(), args.only)
        for c in cases:
            print(f"{c.id:<44} {c.cls:<14} {c.expect:<7} {c.what}")
        counts = Counter((c.sub, c.cls) for c in cases)
        print(f"{len(cases)} cases; " + "; ".join(f"{s} {k}: {n}" for (s, k), n in sorted(counts.items())))
        return 0
    if not args.src or not args.out:
        ap.error("--src and --out are required (or --table, or --list)")
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
