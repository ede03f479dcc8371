"""The documentation site cannot drift from the code.

- ``mkdocs build --strict`` passes: a broken link, a page missing from the nav, a bad mkdocstrings reference fails;
- the generated settings reference (``docs/hooks/reference.py``) lists every setting ``--describe`` prints, with the
  same default and help;
- every command line in the README and the docs (``agentic-rag ...``, ``bash script/...``) names a subcommand and
  flags that exist (parsed against the real parsers; nothing runs), and the checker fails on a renamed flag.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rag.cli import build_parser
from conftest import ROOT

DOCS = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
# a command in a fenced block (continued over lines ending in "\") or in an inline code span; environment
# assignments before it (MODEL_PATH=... agentic-rag train ...) are allowed
COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)*((?:agentic-rag|bash script/)\S*(?:\s.*)?)$")


def hook_module():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command_lines(text: str) -> list[str]:
    """Every ``agentic-rag``/``bash script/`` command of a Markdown text: the lines of its fenced blocks (joined over
    trailing backslashes, comments cut) and its inline code spans."""
    found = []
    in_fence = False
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence, pending = not in_fence, ""
            continue
        if in_fence:
            line = pending + line.strip()
            if line.endswith("\\"):
                pending = line[:-1].rstrip() + " "
                continue
            pending = ""
            code = line.split(" #", 1)[0].strip()
            m = COMMAND.match(code)
            if m:
                found.append(m.group(1))
        else:
            for span in re.findall(r"`([^`]+)`", line):
                m = COMMAND.match(span.strip())
                if m:
                    found.append(m.group(1))
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def script_parser(path: str) -> argparse.ArgumentParser | None:
    """The parser that reads a script's arguments, where the script hands them to one."""
    if path == "script/quickstart.sh":
        from agentic_rag.demo.quickstart import build_parser as quickstart_parser

        return quickstart_parser()
    if path.startswith("script/training/train_zero"):
        from agentic_rag.training.train import build_parser as train_parser

        return train_parser()
    return None


def check_command(command: str) -> list[str]:
    """What is wrong with one documented command line: an unknown subcommand, script or flag (none: [])."""
    try:
        words = shlex.split(command.replace("|", " "))
    except ValueError:
        words = command.replace("|", " ").split()
    words = [w for w in words if w not in ("[", "]")]
    if words[0] == "bash":
        path = words[1]
        if not (ROOT / path).is_file():
            return [f"{command!r}: no script {path}"]
        parser, name, rest = script_parser(path), path, words[2:]
        if parser is None:
            return []
    else:
        parser, name, rest = build_parser(), "agentic-rag", words[1:]
        while rest and not rest[0].startswith("-"):
            subs = _subparsers(parser)
            if not subs:
                break
            if rest[0] not in subs:
                return [f"{command!r}: {name} has no subcommand {rest[0]!r} (it has {sorted(subs)})"]
            name, parser, rest = f"{name} {rest[0]}", subs[rest[0]], rest[1:]
        if name == "agentic-rag serve":
            from agentic_rag.serving.config import build_parser as serve_parser

            parser, _ = serve_parser()
    known = _options(parser)
    problems = []
    for word in rest:
        flag = word.strip("[]{}(),").split("=", 1)[0]
        if re.fullmatch(r"--?[a-zA-Z][\w-]*", flag) and flag not in known:
            problems.append(f"{command!r}: {name} has no flag {flag}")
    return problems


def documented_commands() -> list[tuple[Path, str]]:
    return [(path, cmd) for path in DOCS for cmd in command_lines(path.read_text(encoding="utf-8"))]


def test_the_docs_name_real_commands_and_flags():
    commands = documented_commands()
    assert len(commands) > 40, f"only {len(commands)} command lines found: the extractor is broken"
    problems = [f"{path.relative_to(ROOT)}: {p}" for path, cmd in commands for p in check_command(cmd)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("command, expected", [
    ("agentic-rag train --config x.yaml --chek", "has no flag --chek"),
    ("agentic-rag index link --out DIR --lucen DIR", "has no flag --lucen"),
    ("agentic-rag indx build --corpus FILE", "has no subcommand 'indx'"),
    ("agentic-rag serve --adapter A --indexx I", "has no flag --indexx"),
    ("bash script/training/train_zero4.sh cfg.yaml", "no script"),
    ("bash script/quickstart.sh --task wiki --seed 3", "has no flag --seed"),
])
def test_the_command_check_fails_on_a_renamed_flag(command, expected):
    problems = check_command(command)
    assert problems and expected in problems[0], problems


def test_the_command_extractor_reads_fences_continuations_and_spans():
    text = ("Run `agentic-rag search --index DIR QUERY` or:\n\n```bash\nMODEL_PATH=m agentic-rag train \\\n"
            "    --config c.yaml --check   # validate\nbash script/test.sh\necho agentic-rag\n```\n")
    assert command_lines(text) == ["agentic-rag search --index DIR QUERY", "agentic-rag train --config c.yaml --check",
                                   "bash script/test.sh"]


def test_the_settings_reference_lists_every_setting_as_describe_prints_it():
    from agentic_rag.evaluation.config import EvalConfig
    from agentic_rag.serving.config import ServeConfig
    from agentic_rag.settings import _leaves, _shown
    from agentic_rag.training.config import ExperimentConfig

    sections = dict(part.split("\n", 1) for part in hook_module().settings_page().split("\n## ")[1:])
    for cls, title in ((ExperimentConfig, "Training"), (EvalConfig, "Evaluation"), (ServeConfig, "Chat server")):
        rows = {line.split("|")[1].strip().strip("`"): line for line in sections[title].splitlines()
                if line.startswith("| `")}
        for dotted, value, f in _leaves(cls()):
            assert dotted in rows, f"{cls.__name__}: {dotted} is missing from the settings reference"
            row = rows[dotted].replace("\\|", "|")
            assert f"`{_shown(value)}`" in row, (dotted, _shown(value), row)
            assert f.metadata.get("help", "").replace("\n", " ").strip() in row, (dotted, row)


def test_the_cli_reference_lists_every_command():
    page = hook_module().cli_page()
    for name in _subparsers(build_parser()):
        assert f"## `agentic-rag {name}`" in page, name
    assert "--max-searches" in page  # serve's flags come from its own generated parser


def test_the_documentation_site_builds_strict(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for page in ("index.html", "reference/settings/index.html", "reference/cli/index.html",
                 "reference/api/index.html", "guides/tools/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    assert "max_searches" in (tmp_path / "site" / "reference" / "settings" / "index.html").read_text()
