"""``agentic-rag tools``: list the tools a config gives the agent, with their schemas, or call one, before training.

    agentic-rag tools --config experiments/training/my.yaml
    agentic-rag tools --config my.yaml --call calculate '{"expression": "6 * 7"}'

Reads only the config's ``tools:`` and ``search:`` sections (any config: training, evaluation, serving), builds the
tools with the one function every entry point uses (:func:`~.build.build_tools`), and loads no model. A tool that
cannot be made is one line naming it (exit 2); a call the tool fails is one line too (exit 1).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from ..search.settings import SearchSettings
from ..settings import section
from .settings import tools_setting


@dataclass
class ToolsSections:
    """The part of any config that says what the tools are."""

    search: SearchSettings = section(SearchSettings)
    tools: list[str | dict] = tools_setting()


def load_sections(path: str) -> ToolsSections:
    from ..errors import input_file
    from ..settings import load, read_yaml

    data = read_yaml(input_file(path, "--config", what="config file"))
    picked = {k: data[k] for k in ("search", "tools") if k in data}
    cfg, _ = load(ToolsSections, data=picked, source=path)
    return cfg


def cmd_tools(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .base import is_argument_tool
    from .build import build_tools, describe_tools
    from .python import argument_problem

    cfg = load_sections(args.config)
    tools = build_tools(cfg.tools, search=cfg.search, base_dir=Path(args.config).resolve().parent)
    try:
        if args.call is None:
            described = describe_tools(tools)
            if args.json:
                print(json.dumps(described, indent=1, ensure_ascii=False))
                return 0
            for d in described:
                limits = ", ".join(f"{k} {d[k]}" for k in ("max_calls", "max_observation_tokens") if d[k])
                print(f"{d['name']}  ({d['kind']}{'; ' + limits if limits else ''})")
                print(f"    {d['description']}")
                print(f"    parameters: {json.dumps(d['parameters'], ensure_ascii=False)}")
            return 0
        name, raw = args.call
        if name not in tools:
            raise ValueError(f"--call: no tool named {name!r}; the tools are: {', '.join(tools.names())}")
        try:
            arguments = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--call {name}: the arguments are not JSON ({exc.msg}): {raw!r}") from None
        if not isinstance(arguments, dict):
            raise ValueError(f"--call {name}: the arguments must be a JSON object, got {raw!r}")
        tool = tools.get(name)
        from .base import schema

        if problem := argument_problem(arguments, schema(tool)["parameters"]):
            raise ValueError(f"--call {name}: {problem}")
        try:
            if is_argument_tool(tool):
                state = tools.new_states({"question": args.question}).get(getattr(tool, "state_key", None))
                (result,) = tool.call_batch([(arguments, state)])
            else:
                (result,) = tool.batch([arguments["query"]], args.k)
        except Exception as exc:  # noqa: BLE001 - the tool's own failure, in one line
            print(f"agentic-rag tools: the tool {name} failed: {type(exc).__name__}: {exc}".splitlines()[0])
            return 1
        from .base import ToolError

        if isinstance(result, ToolError):
            print(f"agentic-rag tools: the tool {name} failed: {result}".splitlines()[0])
            return 1
        if isinstance(result, str):
            print(result)
        else:
            for rank, hit in enumerate(result, start=1):
                print(f"{rank:>2}. [{hit.docid}] {hit.title}: {hit.text[:300]}")
        return 0
    finally:
        tools.close()


def register(sub: Any) -> None:
    p = sub.add_parser("tools", help="list the tools a config gives the agent (name, kind, JSON schema), or call one",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="any config file with a tools: section (and search: for search)")
    p.add_argument("--call", nargs=2, metavar=("NAME", "JSON"), default=None,
                   help="call tool NAME with the JSON object of its arguments and print the result")
    p.add_argument("--question", default="", help="with --call: the question a per-rollout tool's reset() gets")
    p.add_argument("--k", type=int, default=3, help="with --call of a search tool: passages to show")
    p.add_argument("--json", action="store_true", help="list the tools as JSON")
    p.set_defaults(func=cmd_tools)
