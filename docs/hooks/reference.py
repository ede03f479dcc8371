"""MkDocs hook: the reference pages, generated from the code at every build, never written by hand.

- ``reference/settings.md``: every setting of training (``agentic-rag train``), evaluation (``agentic-rag eval``)
  and the chat server (``agentic-rag serve``), from the settings layer's dataclasses: the dotted name, the default,
  what a value must be and the help text, the same words ``--describe`` prints (``agentic_rag.settings``);
- ``reference/cli.md``: every ``agentic-rag`` command and subcommand with its usage and each flag's help, from the
  command-line parser itself (``agentic_rag.cli.build_parser``; ``serve`` from its own generated parser).

The Python API page (``reference/api.md``) is mkdocstrings directives over the docstrings. Named in ``mkdocs.yml``
under ``hooks:``; it imports only the settings and parser modules (no torch), so a build takes seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from mkdocs.structure.files import File, Files

SETTINGS_PAGE = "reference/settings.md"
CLI_PAGE = "reference/cli.md"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _value_rule(f: dataclasses.Field) -> str:
    meta = f.metadata
    parts = []
    choices = meta.get("choices")
    if choices is not None:
        names = choices() if callable(choices) else choices
        parts.append("one of " + ", ".join(f"`{c}`" for c in names))
    if meta.get("min") is not None:
        parts.append(f">= {meta['min']}")
    if meta.get("max") is not None:
        parts.append(f"<= {meta['max']}")
    if meta.get("env"):
        parts.append(f"env `{meta['env']}`")
    return "; ".join(parts)


def settings_table(config: Any) -> list[str]:
    from agentic_rag.settings import _leaves, _shown, type_name

    hints: dict[str, Any] = {}

    def collect(cls: type, prefix: str) -> None:
        import typing

        for name, tp in typing.get_type_hints(cls).items():
            hints[prefix + name] = tp
            if dataclasses.is_dataclass(tp):
                collect(tp, f"{prefix}{name}.")

    collect(type(config), "")
    rows = ["| setting | type | default | value | what it does |", "|---|---|---|---|---|"]
    for dotted, value, f in _leaves(config):
        rows.append(f"| `{dotted}` | {_cell(type_name(hints[dotted]))} | `{_cell(_shown(value))}` | "
                    f"{_cell(_value_rule(f))} | {_cell(f.metadata.get('help', ''))} |")
    return rows


def settings_page() -> str:
    from agentic_rag.evaluation.config import EvalConfig
    from agentic_rag.serving.config import ServeConfig
    from agentic_rag.training.config import ExperimentConfig

    out = ["# Settings", "",
           "Generated from the settings layer at build time (`docs/hooks/reference.py`): each setting's dotted name, "
           "type, default, what a value must be and its help, the words `--describe` prints. A YAML config sets "
           "them by section (`rollout: {max_searches: 2}`); `--set rollout.max_searches=2` on any command; the "
           "sections `rollout`, `prompt` and `search` are the same classes everywhere.", ""]
    for title, cls, command in (("Training", ExperimentConfig, "agentic-rag train --describe"),
                                ("Evaluation", EvalConfig, "agentic-rag eval --describe"),
                                ("Chat server", ServeConfig, "agentic-rag serve --describe")):
        out += [f"## {title}", "", f"`{command}` prints these with the values a config resolves to.", ""]
        out += settings_table(cls())
        out.append("")
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((name, sub, helps.get(name) or ""))
    return found


def _flags_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | default | what it does |", "|---|---|---|"]
    n = 0
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, (argparse._SubParsersAction,
                                                                   argparse._HelpAction)):
            continue
        name = ", ".join(action.option_strings) or action.metavar or action.dest
        default = "" if action.default in (None, argparse.SUPPRESS, False, [], "") else f"`{action.default}`"
        help_text = action.help or ""
        if action.choices is not None and not isinstance(action.choices, dict):
            help_text += " (one of " + ", ".join(f"`{c}`" for c in action.choices) + ")"
        rows.append(f"| `{_cell(name)}` | {_cell(default)} | {_cell(help_text)} |")
        n += 1
    return rows if n else []


def _command(name: str, parser: argparse.ArgumentParser, summary: str, level: int) -> list[str]:
    if name == "agentic-rag serve":  # its flags are generated from its settings by its own parser
        from agentic_rag.serving.config import build_parser

        parser, _ = build_parser()
    out = [f"{'#' * level} `{name}`", ""]
    if summary:
        out += [_cell(summary), ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    if parser.description and parser.description != summary:
        out += [parser.description.strip(), ""]
    table = _flags_table(parser)
    if table:
        out += table + [""]
    for sub_name, sub, sub_summary in _subcommands(parser):
        out += _command(f"{name} {sub_name}", sub, sub_summary, min(level + 1, 4))
    return out


def cli_page() -> str:
    from agentic_rag.cli import build_parser

    parser = build_parser()
    out = ["# Commands", "",
           "Generated from the command-line parser at build time (`docs/hooks/reference.py`): every `agentic-rag` "
           "command, its usage and its flags' help, as `--help` prints them.", "",
           "```text", parser.format_usage().strip(), "```", ""]
    out += _flags_table(parser) + [""]
    for name, sub, summary in _subcommands(parser):
        out += _command(f"agentic-rag {name}", sub, summary, 2)
    return "\n".join(out)


def on_files(files: Files, config: Any) -> Files:
    for uri, make in ((SETTINGS_PAGE, settings_page), (CLI_PAGE, cli_page)):
        if files.get_file_from_path(uri) is not None:
            raise RuntimeError(f"{uri} is generated by docs/hooks/reference.py: remove the file from docs/")
        files.append(File.generated(config, uri, content=make()))
    return files
