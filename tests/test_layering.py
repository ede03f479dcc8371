"""Imports point one way (DESIGN.md): search <- tools <- rollout <- rewards/data <- training; evaluation and the
chat service reuse rollout and know nothing of the trainer.

Every module of a package is parsed with ``ast`` (nothing is imported, so a lazy import inside a function counts
as much as one at the top) and each import is resolved to an absolute module name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "agentic_rag"

# package -> the packages of agentic_rag it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "search": ("data", "tools", "rollout", "rewards", "training", "evaluation", "serving", "demo", "models",
               "cli"),
    "tools": ("data", "rollout", "rewards", "training", "evaluation", "serving", "demo"),
    "rollout": ("data", "rewards", "training", "evaluation", "serving", "demo", "cli"),
    "rewards": ("training", "evaluation", "serving", "demo"),
    "evaluation": ("training", "serving", "demo"),
    "serving": ("training", "evaluation", "demo"),
}


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, src: Path = SRC) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` for every import statement in ``path`` (a file under ``src``), relative
    ones resolved."""
    name = _module_name(path, src)
    # the package a relative import is resolved against: the module's own package (itself for __init__)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # ``from .. import data`` imports a package by name
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return found


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        for line, target in imported_modules(path):
            for other in forbidden:
                prefix = f"agentic_rag.{other}"
                if target == prefix or target.startswith(prefix + "."):
                    bad.append(f"{path.relative_to(SRC)}:{line} imports {prefix}")
    return sorted(set(bad))


def test_relative_imports_are_resolved(tmp_path):
    pkg = tmp_path / "agentic_rag" / "search"
    pkg.mkdir(parents=True)
    mod = pkg / "m.py"
    mod.write_text("from ..data.questions import QARow\nfrom .types import Hit\nfrom .. import rollout\n"
                   "def f():\n    import agentic_rag.training.trainer\n")
    init = pkg / "__init__.py"
    init.write_text("from .cache import X\nfrom ..evaluation import runner\n")
    assert [t for _, t in imported_modules(mod, tmp_path)] == [
        "agentic_rag.data.questions", "agentic_rag.data.questions.QARow", "agentic_rag.search.types",
        "agentic_rag.search.types.Hit", "agentic_rag", "agentic_rag.rollout", "agentic_rag.training.trainer"]
    assert [t for _, t in imported_modules(init, tmp_path)][:3] == [
        "agentic_rag.search.cache", "agentic_rag.search.cache.X", "agentic_rag.evaluation"]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    assert (PACKAGE / package).is_dir(), package
    bad = violations(package, FORBIDDEN[package])
    assert not bad, f"agentic_rag.{package} must not import {', '.join(FORBIDDEN[package])}:\n" + "\n".join(bad)
