"""Index directories: manifest, missing/mismatched indexes and their messages, linking external indexes."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from agentic_rag.cli import main
from agentic_rag.errors import UserError
from agentic_rag.search import IndexMismatchError, IndexMissingError, open_searcher
from agentic_rag.search.build import build_index, link_index, open_docstore
from agentic_rag.search.corpus import CorpusFormatError, build_corpus
from agentic_rag.search.manifest import IndexManifest
from conftest import shared


def test_manifest_records_the_build(wiki_index, wiki_corpus):
    m = IndexManifest.load(wiki_index)
    n = len(json.loads(wiki_corpus.read_text()))
    assert m.corpus["passages"] == n and m.corpus["format"] == "json-list" and len(m.corpus["sha256"]) == 64
    assert m.bm25.docs == n and (m.bm25.k1, m.bm25.b) == (0.9, 0.4)
    assert m.dense.docs == n and m.dense.dim == 384 and m.dense.encoder.endswith("model")
    assert {"pyserini", "faiss-cpu", "anserini"} <= set(m.versions)


def test_missing_index_says_how_to_build(tmp_path):
    with pytest.raises(IndexMissingError, match="agentic-rag index build --corpus"):
        open_searcher(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexMissingError, match="no index manifest"):
        open_searcher(tmp_path / "empty")


def test_a_bare_lucene_directory_suggests_link(wiki_index):
    with pytest.raises(IndexMissingError, match="agentic-rag index\\s+link --out NEW_DIR --lucene"):
        open_searcher(wiki_index / "bm25")


def _copy(wiki_index, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(wiki_index, dst)
    return dst


def _edit_manifest(index, fn):
    path = index / "manifest.json"
    raw = json.loads(path.read_text())
    fn(raw)
    path.write_text(json.dumps(raw))


def test_mismatches_fail_with_a_rebuild_hint(wiki_index, tmp_path, wiki_corpus):
    idx = _copy(wiki_index, tmp_path)
    _edit_manifest(idx, lambda m: m["bm25"].update(docs=12))
    with pytest.raises(IndexMismatchError, match="(?s)holds 345 documents but the manifest says 12.*Rebuild it with"):
        open_searcher(idx, "bm25")

    idx2 = tmp_path / "v"
    shutil.copytree(wiki_index, idx2)
    _edit_manifest(idx2, lambda m: m.update(format_version=99))
    with pytest.raises(IndexMismatchError, match="format_version 99"):
        open_searcher(idx2)

    (idx2 / "manifest.json").write_text("{not json")
    with pytest.raises(IndexMismatchError, match="not valid JSON"):
        open_searcher(idx2)

    other = tmp_path / "other.jsonl"
    other.write_text('{"id": "1", "title": "T", "text": "another corpus"}\n')
    with pytest.raises(IndexMismatchError, match="built from a different corpus"):
        open_searcher(wiki_index, corpus=str(other))
    open_searcher(wiki_index, corpus=str(wiki_corpus))  # the right corpus passes


def test_dense_part_checks(wiki_index, tmp_path):
    idx = _copy(wiki_index, tmp_path)
    _edit_manifest(idx, lambda m: m.update(dense=None))
    with pytest.raises(IndexMissingError, match="(?s)no dense part.*--dense-encoder"):
        open_searcher(idx, "dense")
    with pytest.raises(IndexMissingError, match="no dense part"):
        open_searcher(idx, "hybrid")

    idx2 = tmp_path / "moved"
    shutil.copytree(wiki_index, idx2)
    _edit_manifest(idx2, lambda m: m["dense"].update(encoder="/nonexistent/encoder"))
    with pytest.raises(IndexMismatchError, match="Pass the same encoder with --dense-encoder"):
        open_searcher(idx2, "dense")
    assert open_searcher(idx2, "dense", dense_encoder="minilm").search("Teutberga", 1)[0].docid == "0"

    _edit_manifest(idx2, lambda m: m["dense"].update(encoder_fingerprint="0123456789abcdef"))
    with pytest.raises(IndexMismatchError, match="not the one the FAISS index was built with"):
        open_searcher(idx2, "dense", dense_encoder="minilm")

    shutil.rmtree(idx2 / "bm25")
    with pytest.raises(IndexMissingError, match="BM25 index .* is missing"):
        open_searcher(idx2, "bm25")


def test_rebuild_is_skipped_when_up_to_date_and_atomic(wiki_corpus, tmp_path, caplog):
    out = tmp_path / "idx"
    build_index(wiki_corpus, out, progress=False)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    with caplog.at_level("INFO"):
        build_index(wiki_corpus, out, progress=False)
    assert (out / "manifest.json").stat().st_mtime_ns == stamp and "up to date" in caplog.text
    build_index(wiki_corpus, out, progress=False, force=True)
    assert (out / "manifest.json").stat().st_mtime_ns != stamp
    assert not (out.parent / "idx.partial").exists() and not (out.parent / "idx.old").exists()


def test_failed_build_leaves_no_index(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "ok"}\n{"id": "2"}\n')
    with pytest.raises(Exception, match="bad.jsonl:2"):
        build_index(bad, tmp_path / "idx", progress=False)
    assert not (tmp_path / "idx").exists()
    with pytest.raises(ValueError, match="nothing to build"):
        build_index(bad, tmp_path / "idx", bm25=False, progress=False)


def test_link_an_index_built_elsewhere(wiki_index, tmp_path, wiki_corpus):
    """An existing Lucene index and a FAISS file are used in place, as a Pyserini prebuilt index would be."""
    linked = tmp_path / "linked"
    link_index(linked, lucene=str(wiki_index / "bm25"), progress=False)
    bm = open_searcher(linked, "bm25")
    assert [h.docid for h in bm.search("Teutberga queen of Lotharingia", 3)] == ["0", "4", "7"]
    assert bm.search("Teutberga", 1)[0].title == "Teutberga"

    both = tmp_path / "both"
    link_index(both, lucene=str(wiki_index / "bm25"), faiss_dir=str(wiki_index / "dense" / "index.faiss"),
               dense_encoder="minilm", corpus=str(wiki_corpus), progress=False)
    assert [h.docid for h in open_searcher(both, "dense").search("Who was the wife of Lothair II?", 3)] == \
        ["4", "8", "6"]
    assert [h.docid for h in open_searcher(both, "hybrid").search("Who was the wife of Lothair II?", 3)] == \
        ["8", "4", "6"]
    with pytest.raises(ValueError, match="--faiss needs --dense-encoder"):
        link_index(tmp_path / "x", faiss_dir=str(wiki_index / "dense" / "index.faiss"))


def test_cli_index_build_info_and_errors(wiki_corpus, tmp_path, capsys):
    out = tmp_path / "cli_idx"
    assert main(["index", "build", "--corpus", str(wiki_corpus), "--out", str(out), "--bm25"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {
        "index": str(out), "passages": 345, "skipped": 0, "bm25": True, "dense": False}
    assert main(["index", "info", "--index", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["corpus"]["passages"] == 345
    assert main(["search", "--index", str(out), "--retriever", "dense", "Teutberga"]) == 2
    assert "no dense part" in capsys.readouterr().err
    assert main(["search", "--index", str(tmp_path / "none"), "Teutberga"]) == 2
    assert "agentic-rag index build" in capsys.readouterr().err


def _pyserini_faiss_dir(wiki_index, dest):
    """A Pyserini-style FAISS directory ('index' + 'docid') over the real MiniLM vectors of the test index,
    rows reversed so that row number and docid disagree: only the docid file can pair them up."""
    import faiss
    import numpy as np

    built = faiss.read_index(str(wiki_index / "dense" / "index.faiss"))
    vectors = built.reconstruct_n(0, built.ntotal)  # the encoder's output for every passage, in corpus order
    docids = [p.id for p in open_docstore(wiki_index, IndexManifest.load(wiki_index))]
    order = np.arange(built.ntotal)[::-1]
    index = faiss.IndexFlatIP(built.d)
    index.add(np.ascontiguousarray(vectors[order]))
    dest.mkdir()
    faiss.write_index(index, str(dest / "index"))
    (dest / "docid").write_text("".join(docids[i] + "\n" for i in order))
    return dest, [docids[i] for i in order]


def test_link_a_pyserini_faiss_directory_whose_text_comes_from_lucene(wiki_index, tmp_path):
    fdir, docids = _pyserini_faiss_dir(wiki_index, tmp_path / "faiss")
    linked = tmp_path / "linked"
    m = link_index(linked, lucene=str(wiki_index / "bm25"), faiss_dir=str(fdir), dense_encoder="minilm",
                   progress=False)
    assert m.docstore is None and m.dense.docids == str(fdir / "docid") and m.dense.docs == 345
    dense = open_searcher(linked, "dense")
    hits = dense.search("Who was the wife of Lothair II?", 3)
    assert [h.docid for h in hits] == ["4", "8", "6"]  # as from the index built here (test_searchers)
    bm25 = open_searcher(linked, "bm25")
    for h in hits:  # the text is Lucene's stored document for that docid
        stored = bm25.doc(h.docid)
        assert (h.title, h.text) == (stored.title, stored.text) and h.text
    assert dense.search("soul music queen from Detroit", 1)[0].title == "Aretha Franklin"
    assert [h.docid for h in open_searcher(linked, "hybrid").search("Who was the wife of Lothair II?", 3)] == \
        ["8", "4", "6"]

    (fdir / "docid").write_text("".join(d + "\n" for d in docids[:-1]))  # a row short
    with pytest.raises(IndexMismatchError, match="names 344 rows but the FAISS index holds 345"):
        link_index(tmp_path / "short", lucene=str(wiki_index / "bm25"), faiss_dir=str(fdir),
                   dense_encoder="minilm", progress=False)
    with pytest.raises(IndexMismatchError, match="names 344 rows"):  # found on opening too
        open_searcher(linked, "dense")
    (fdir / "docid").write_text("".join(f"no-such-{d}\n" for d in docids))
    with pytest.raises(IndexMismatchError, match="which the Lucene index .* does not hold"):
        link_index(tmp_path / "wrong", lucene=str(wiki_index / "bm25"), faiss_dir=str(fdir),
                   dense_encoder="minilm", progress=False)


def test_link_refuses_a_faiss_index_that_could_not_be_opened(wiki_index, tmp_path):
    """No docid file and no --corpus: nothing pairs FAISS rows with Lucene documents; refused at link time."""
    fdir = tmp_path / "faiss_no_docid"
    fdir.mkdir()
    shutil.copy(wiki_index / "dense" / "index.faiss", fdir / "index")
    for faiss_arg in (fdir, wiki_index / "dense" / "index.faiss"):
        with pytest.raises(ValueError, match="(?s)no 'docid' file.*Pass --corpus FILE"):
            link_index(tmp_path / "x", lucene=str(wiki_index / "bm25"), faiss_dir=str(faiss_arg),
                       dense_encoder="minilm", progress=False)
    assert not (tmp_path / "x").exists()
    assert main(["index", "link", "--out", str(tmp_path / "y"), "--lucene", str(wiki_index / "bm25"),
                 "--faiss", str(fdir), "--dense-encoder", "minilm"]) == 2
    with pytest.raises(UserError, match=re.escape(f"--faiss {tmp_path / 'nowhere'}: no such FAISS directory or file")):
        link_index(tmp_path / "x", lucene=str(wiki_index / "bm25"), faiss_dir=str(tmp_path / "nowhere"),
                   dense_encoder="minilm", progress=False)
    assert not (tmp_path / "x").exists()


def test_index_build_chunk_words_format_and_skip_bad_count_in_the_up_to_date_check(tmp_path, capsys, caplog):
    kilt = tmp_path / "kilt3.jsonl"
    kilt.write_text("".join(shared("r1-searcher/kilt_samples/filtered_kilt_sample_100.jsonl").open()
                            .readlines()[:3]))
    out = tmp_path / "kidx"

    def build(*extra: str) -> dict:
        assert main(["index", "build", "--corpus", str(kilt), "--out", str(out), *extra]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    def passages(chunk: int) -> int:
        return build_corpus(kilt, tmp_path / f"c{chunk}.jsonl", chunk_size=chunk, progress=False).passages

    assert build("--chunk-words", "50")["passages"] == passages(50)
    assert IndexManifest.load(out).corpus["chunk_words"] == 50
    stamp = (out / "manifest.json").stat().st_mtime_ns
    with caplog.at_level("INFO"):
        build("--chunk-words", "50", "--format", "kilt")  # auto resolved to kilt: the same index
    assert (out / "manifest.json").stat().st_mtime_ns == stamp and "up to date" in caplog.text
    assert build("--chunk-words", "100")["passages"] == passages(100) < passages(50)  # rebuilt
    assert open_searcher(out).search("first letter of the alphabet", 1)[0].title == "A"
    with pytest.raises(CorpusFormatError):  # another format is not "up to date": it is read, and fails
        build_index(kilt, out, fmt="pyserini-jsonl", progress=False)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "\\"One\\"\\nfirst passage"}\n{"id": "2"}\n'
                   '{"id": "3", "contents": "\\"Three\\"\\nthird passage"}\n')
    out = tmp_path / "bidx"
    assert main(["index", "build", "--corpus", str(bad), "--out", str(out), "--skip-bad"]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out.strip().splitlines()[-1])["skipped"] == 1 and "skipped 1" in printed.err
    with pytest.raises(CorpusFormatError, match="bad.jsonl:2"):  # without --skip-bad: rebuilt, and it fails
        build_index(bad, out, progress=False)
    assert open_searcher(out).search("third passage", 1)[0].docid == "3"  # the old index is still there
