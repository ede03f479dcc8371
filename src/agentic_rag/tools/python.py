"""Tools written as Python: a typed function, or a class whose instance lives for one rollout.

A **function** with type hints and a Google-style docstring is a tool, as in TRL 1.16's ``GRPOTrainer(tools=[fn])``:
its JSON schema comes from ``transformers.utils.get_json_schema`` (the name, the docstring's first paragraph as the
description, each argument's type and ``Args:`` line). It may be sync or async; it returns text (anything else is
shown as JSON). It is named in YAML as ``module:function`` or ``path/to/file.py:function``.

A **class** is a per-rollout environment, as verl's ``BaseTool`` / TRL's ``environment_factory``: one instance per
rollout, made with no arguments, then ``reset(**row)`` with the question's fields (``question``, ``answers``,
``id``, and the row's other fields) when it has that method; each public method (typed, with a docstring) is a tool,
and the methods of one rollout share its instance.

An argument of the wrong type or a missing one is the model's mistake: the call gets an error result, counted
(``malformed_call``), and the function is not run. An exception raised by the function is the tool's failure: an
error result too, counted (``tool_failed``).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import ToolError

_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                            "boolean": (bool,), "array": (list,), "object": (dict,)}


class ToolLoadError(ValueError):
    """A tool that cannot be made: the message names the tool and says why."""


def load_object(ref: str, *, base_dir: str | Path | None = None) -> Any:
    """The object ``ref`` names: ``module:attr`` or ``path/to/file.py:attr`` (a relative path is taken from
    ``base_dir``, the config file's folder, then from the working directory)."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ToolLoadError(f"python tool {ref!r}: name it as module:function or path/to/file.py:function")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_absolute():
                candidates = ([Path(base_dir) / path] if base_dir else []) + [Path.cwd() / path]
                path = next((c for c in candidates if c.is_file()), candidates[0])
            if not path.is_file():
                raise ToolLoadError(f"python tool {ref!r}: no file {path}")
            name = f"agentic_rag_user_tools.{path.stem}_{abs(hash(str(path.resolve())))}"
            module = sys.modules.get(name)
            if module is None:
                spec = importlib.util.spec_from_file_location(name, path)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
        else:
            module = importlib.import_module(target)
    except ToolLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module failed to import: say which and why, in one line
        raise ToolLoadError(f"python tool {ref!r}: importing {target} failed: {type(exc).__name__}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ToolLoadError(f"python tool {ref!r}: {target} has no {attr!r}") from None


def function_schema(fn: Callable, *, ref: str = "") -> dict[str, Any]:
    """``{"name", "description", "parameters"}`` of a typed, documented function (transformers' ``get_json_schema``,
    as TRL builds its tools' schemas)."""
    from transformers.utils import get_json_schema

    try:
        out = get_json_schema(fn)["function"]
    except Exception as exc:  # noqa: BLE001 - DocstringParsingException, TypeHintParsingException, ...
        raise ToolLoadError(f"python tool {ref or getattr(fn, '__name__', fn)!r}: no JSON schema can be made for "
                            f"it ({type(exc).__name__}: {exc}); give every argument a type hint and the function a "
                            f"Google-style docstring with an Args: line per argument") from exc
    out.setdefault("parameters", {"type": "object", "properties": {}})
    return out


def argument_problem(arguments: Mapping[str, Any], parameters: Mapping[str, Any]) -> str | None:
    """What is wrong with ``arguments`` for the schema ``parameters`` (missing, unknown or mistyped arguments, one
    level deep), or None."""
    props = parameters.get("properties") or {}
    missing = [n for n in parameters.get("required") or [] if n not in arguments]
    if missing:
        return f"missing argument(s): {', '.join(missing)}"
    unknown = [n for n in arguments if n not in props]
    if unknown:
        return f"unknown argument(s): {', '.join(unknown)} (the arguments are: {', '.join(props) or 'none'})"
    for name, value in arguments.items():
        kind = props[name].get("type")
        kinds = kind if isinstance(kind, list) else [kind] if kind else []
        if value is None and ("null" in kinds or props[name].get("nullable")):
            continue
        allowed = tuple(t for k in kinds for t in _JSON_TYPES.get(k, (object,)))
        if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            return f"argument {name!r} must be {' or '.join(kinds)}, got {json.dumps(value)[:60]}"
        choices = props[name].get("enum")
        if choices and value not in choices:
            return f"argument {name!r} must be one of {', '.join(map(str, choices))}"
    return None


def as_text(value: Any) -> str:
    """A tool's return value as the text the model sees."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _run_calls(fns: Sequence[Callable[..., Any]], arguments: Sequence[Mapping[str, Any]]) -> list[str | ToolError]:
    """Call each ``fns[i](**arguments[i])``: sync ones in turn, async ones together in one event loop."""
    out: list[str | ToolError] = [ToolError("")] * len(fns)
    pending: list[tuple[int, Any]] = []
    for i, (fn, args) in enumerate(zip(fns, arguments, strict=True)):
        try:
            value = fn(**args)
        except Exception as exc:  # noqa: BLE001 - the tool's failure, shown to the model and counted
            out[i] = ToolError(f"{type(exc).__name__}: {str(exc)[:300]}")
            continue
        if inspect.isawaitable(value):
            pending.append((i, value))
        else:
            out[i] = as_text(value)
    if pending:
        async def gather() -> list[Any]:
            return await asyncio.gather(*(c for _, c in pending), return_exceptions=True)

        for (i, _), value in zip(pending, asyncio.run(gather()), strict=True):
            out[i] = (ToolError(f"{type(value).__name__}: {str(value)[:300]}") if isinstance(value, BaseException)
                      else as_text(value))
    return out


class PythonTool:
    """A typed Python function as a tool (see the module docstring)."""

    retrieves = False
    state_key = None

    def __init__(self, fn: Callable[..., Any], *, ref: str = "", max_calls: int | None = None,
                 max_observation_tokens: int | None = None):
        spec = function_schema(fn, ref=ref)
        self.fn, self.ref = fn, ref or getattr(fn, "__qualname__", "")
        self.name, self.description, self.parameters = spec["name"], spec.get("description", ""), spec["parameters"]
        self.max_calls, self.max_observation_tokens = max_calls, max_observation_tokens

    def new_state(self, row: Mapping[str, Any]) -> None:
        return None

    def call_batch(self, calls: Sequence[tuple[Mapping[str, Any], Any]]) -> list[str | ToolError]:
        return _run_calls([self.fn] * len(calls), [args for args, _ in calls])


class MethodTool:
    """One public method of a class tool: called on the instance its rollout made (``state``)."""

    retrieves = False

    def __init__(self, cls: type, method: str, spec: Mapping[str, Any], *, max_calls: int | None = None,
                 max_observation_tokens: int | None = None):
        self.cls, self.method, self.state_key = cls, method, cls
        self.name, self.description, self.parameters = spec["name"], spec.get("description", ""), spec["parameters"]
        self.max_calls, self.max_observation_tokens = max_calls, max_observation_tokens

    def new_state(self, row: Mapping[str, Any]) -> Any:
        instance = self.cls()
        reset = getattr(instance, "reset", None)
        if callable(reset):
            accepts = inspect.signature(reset).parameters.values()
            if any(p.kind is p.VAR_KEYWORD for p in accepts):
                reset(**row)
            else:
                reset(**{k: v for k, v in row.items() if k in {p.name for p in accepts}})
        return instance

    def call_batch(self, calls: Sequence[tuple[Mapping[str, Any], Any]]) -> list[str | ToolError]:
        return _run_calls([getattr(state, self.method) for _, state in calls], [args for args, _ in calls])


def class_tools(cls: type, *, ref: str = "", **limits: Any) -> list[MethodTool]:
    """The tools of a class: each public method of an instance (made once here, with no arguments, to read the
    methods' schemas; each rollout gets its own)."""
    label = ref or cls.__qualname__
    try:
        probe = cls()
    except Exception as exc:  # noqa: BLE001 - the user's class cannot be made: say so in one line
        raise ToolLoadError(f"python tool {label!r}: the class must be made with no arguments "
                            f"({type(exc).__name__}: {exc})") from exc
    tools = []
    for name, member in inspect.getmembers(probe, inspect.ismethod):
        if name.startswith("_") or name == "reset":
            continue
        spec = function_schema(member, ref=f"{label}.{name}")
        tools.append(MethodTool(cls, name, spec, **limits))
    if not tools:
        raise ToolLoadError(f"python tool {label!r}: the class has no public method to call")
    return tools


def python_tools(ref: str, *, base_dir: str | Path | None = None, **limits: Any) -> list[PythonTool | MethodTool]:
    """The tools ``ref`` names: a function (one tool) or a class (one tool per public method)."""
    obj = load_object(ref, base_dir=base_dir)
    if inspect.isclass(obj):
        return list(class_tools(obj, ref=ref, **limits))
    if callable(obj):
        return [PythonTool(obj, ref=ref, **limits)]
    raise ToolLoadError(f"python tool {ref!r} is a {type(obj).__name__}, not a function or a class")
