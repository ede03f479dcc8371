"""The ``tools:`` section, one shape in every YAML (training, evaluation, serving, gold trajectories) and in a trained
adapter's ``agentic_rag.json``. Imports nothing heavy: a config check reads it before any tool loads::

    tools:
      - search                                      # the index search tool (its settings stay under search:)
      - python: my_tools.py:calculate               # a function, by file path or module:function
      - python: my_pkg.envs:WikiEnv                 # a class: one instance per rollout, its public methods are tools
      - mcp: {command: [python, units_server.py]}   # every tool of an MCP server (or url: http://127.0.0.1:PORT/mcp)

A mapping entry may also hold ``max_calls`` (calls per rollout; none: only the turns limit them) and
``max_observation_tokens`` (one result's tokens, tags included; none: ``rollout.max_observation_tokens``). Without a
``tools:`` section a config means ``[search]``, as every config and adapter before it did.
"""

from __future__ import annotations

from typing import Any

from ..settings import setting

DEFAULT_TOOLS = ["search"]
BUILTIN_TOOLS = ("search",)
KINDS = ("python", "mcp")
LIMITS = ("max_calls", "max_observation_tokens")


def spec_problems(specs: Any) -> str | None:
    """What is wrong with the shape of a ``tools:`` list (one line), or None. Whether a tool loads is checked when it
    is built (:func:`agentic_rag.tools.build.build_tools`)."""
    if not isinstance(specs, list):
        return f"must be a list of tools, got {specs!r}"
    problems = []
    for i, spec in enumerate(specs):
        if isinstance(spec, str):
            if spec not in BUILTIN_TOOLS:
                problems.append(f"[{i}] {spec!r} is not a built-in tool ({', '.join(BUILTIN_TOOLS)}); a tool of your "
                                f"own is a mapping (python: file.py:function, or mcp: {{command: [...]}})")
            continue
        if not isinstance(spec, dict):
            problems.append(f"[{i}] must be a tool name or a mapping, got {spec!r}")
            continue
        kinds = [k for k in KINDS if k in spec]
        unknown = [k for k in spec if k not in (*KINDS, *LIMITS)]
        if len(kinds) != 1:
            problems.append(f"[{i}] must have exactly one of {', '.join(KINDS)}, got {sorted(spec)}")
        elif unknown:
            problems.append(f"[{i}] has unknown key(s) {', '.join(map(str, unknown))} (allowed: {kinds[0]}, "
                            f"{', '.join(LIMITS)})")
        elif kinds[0] == "python" and (not isinstance(spec["python"], str) or ":" not in spec["python"]):
            problems.append(f"[{i}] python: must be module:function or path/to/file.py:function, got "
                            f"{spec['python']!r}")
        elif kinds[0] == "mcp" and not (isinstance(spec["mcp"], dict) and
                                        (isinstance(spec["mcp"].get("command"), list) or
                                         isinstance(spec["mcp"].get("url"), str))):
            problems.append(f"[{i}] mcp: must be a mapping with command: [program, args...] or url: http://...")
        for key in LIMITS:
            value = spec.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                problems.append(f"[{i}] {key} must be a positive integer, got {value!r}")
    return "; ".join(problems) or None


def tools_setting() -> Any:
    """The ``tools`` field of a config (see the module docstring)."""
    return setting(list(DEFAULT_TOOLS), "the agent's tools: search (the index search tool), {python: "
                                        "file.py:function or module:Class}, {mcp: {command: [...]} or {url: ...}}; "
                                        "each mapping may set max_calls and max_observation_tokens",
                   check=spec_problems)


def uses_search(specs: list[Any]) -> bool:
    return "search" in specs
