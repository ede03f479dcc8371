"""Shared fixtures: the real data in ../shared/data and small real indexes built once per session."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("AGENTIC_RAG_SHARED_DATA", ROOT.parent / "shared" / "data"))
FIXTURES = Path(__file__).resolve().parent / "fixtures"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def shared(rel: str) -> Path:
    path = SHARED / rel
    if not path.exists():
        pytest.fail(f"missing shared data file {path} (set AGENTIC_RAG_SHARED_DATA to ../shared/data)")
    return path


# The 2WikiMultiHopQA corpus, cut to the gold passages of the first 20 dev questions plus the first 300
# passages: small enough to embed in seconds, real enough to have exact expected docids.
N_DEV = 20


def wiki_subset() -> list[dict]:
    corpus = json.loads(shared("hipporag/2wikimultihopqa_corpus.json").read_text())
    dev = json.loads(shared("tts-project/2wikimultihopqa_dev500.json").read_text())[:N_DEV]
    gold = {t for q in dev for t in q["supporting_facts"]}
    keep = [i for i, p in enumerate(corpus) if i < 300 or p["title"] in gold]
    return [{"id": str(i), "title": corpus[i]["title"], "text": corpus[i]["text"]} for i in keep]


@pytest.fixture(scope="session")
def wiki_corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "wiki_subset.json"
    path.write_text(json.dumps(wiki_subset()))
    return path


@pytest.fixture(scope="session")
def wiki_index(tmp_path_factory, wiki_corpus) -> Path:
    """BM25 + dense (bundled MiniLM) index over the 2Wiki subset."""
    from agentic_rag.search.build import build_index

    out = tmp_path_factory.mktemp("index") / "wiki"
    build_index(wiki_corpus, out, bm25=True, dense_encoder="minilm", progress=False)
    return out


@pytest.fixture(scope="session")
def dev_questions() -> Path:
    return shared("tts-project/2wikimultihopqa_dev500.json")


# A small corpus (the first 60 2Wiki passages), its BM25 index and the Qwen tokenizer as a folder: the inputs of the
# real-process tests of the command line (test_user_slips.py, test_reliability.py).
@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    rows = json.loads(shared("hipporag/2wikimultihopqa_corpus.json").read_text())[:60]
    path = tmp_path_factory.mktemp("corpus") / "corpus.json"
    path.write_text(json.dumps(rows))
    return path


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, corpus_file) -> Path:
    from agentic_rag.search.build import build_index

    out = tmp_path_factory.mktemp("index") / "idx"
    build_index(corpus_file, out, bm25=True, progress=False)
    return out


@pytest.fixture(scope="module")
def tok_dir(qwen_tokenizer, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tokenizer")
    qwen_tokenizer.save_pretrained(str(d))
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_search_server(index_dir: Path | str, *options: str, timeout_s: float = 180,
                        log_level: str = "WARNING") -> tuple[subprocess.Popen, str]:
    """``agentic-rag serve-search`` on a free port of 127.0.0.1, as a user starts it; returns once /health answers
    (the process and its URL), or fails the test with the server's output."""
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentic_rag.cli", "--log-level", log_level, "serve-search",
                             "--index", str(index_dir), "--port", str(port), *options],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.3)
        if proc.poll() is not None:
            pytest.fail("server exited:\n" + proc.stdout.read())
    proc.kill()
    pytest.fail(f"server did not start in {timeout_s:.0f} s")


# ------------------------------------------------------------------------------------ models and tokenizers


@pytest.fixture(scope="session")
def qwen_tokenizer(tmp_path_factory):
    """The real Qwen2 vocabulary with the Qwen3 tokenizer config over it: ChatML template, <think> tokens."""
    import shutil

    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("qwen_tok")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(shared(f"rtp-llm-qwen-tokenizer/qwen2_tokenizer/{name}"), d / name)
    shutil.copy(shared("rtp-llm-qwen-tokenizer/qwen3_30b_tokenizer_config/tokenizer_config.json"),
                d / "tokenizer_config.json")
    return AutoTokenizer.from_pretrained(str(d))


@pytest.fixture(scope="module")
def smol_tokenizer():
    """The packaged SmolLM2-135M-Instruct's tokenizer (converted from its GGUF once, then cached). Module-scoped: the
    native dialect installs its tool template on a tokenizer whose own knows no tools."""
    from agentic_rag.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def qwen2_tokenizer():
    """The plain Qwen2 tokenizer as shipped (no <think> special tokens)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shared("rtp-llm-qwen-tokenizer/qwen2_tokenizer")))


def tiny_qwen_config(vocab_size: int, layers: int = 2, hidden: int = 64):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=4096, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def tiny_qwen(qwen_tokenizer):
    """A 2-layer random-init Qwen2 model over the real vocabulary (eval mode, float32, seed 0)."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(tiny_qwen_config(len(qwen_tokenizer))).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, qwen_tokenizer) -> Path:
    """The tiny random-init Qwen2 model and the Qwen tokenizer saved together, loadable by path."""
    import torch
    from transformers import Qwen2ForCausalLM

    d = tmp_path_factory.mktemp("tiny_model")
    torch.manual_seed(0)
    Qwen2ForCausalLM(tiny_qwen_config(len(qwen_tokenizer))).save_pretrained(d)
    qwen_tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def world_dir(tmp_path_factory) -> Path:
    """The embedded fictional-world task (seed 0) with its BM25 index in world_dir/index."""
    from agentic_rag.data.world import write_world
    from agentic_rag.search.build import build_index

    d = tmp_path_factory.mktemp("world")
    paths = write_world(d / "world", seed=0)
    build_index(paths["corpus"], d / "index", progress=False)
    return d
