"""The one settings layer: every setting a dataclass field with its help, read from YAML, the environment, a
trained adapter and the command line, checked as a whole before anything loads.

Training (:class:`agentic_rag.training.config.ExperimentConfig`), evaluation
(:class:`agentic_rag.evaluation.config.EvalConfig`) and the chat server (:class:`agentic_rag.serving.config.
ServeConfig`) are dataclasses of sections; the sections they share are the same classes under the same names
(``rollout``, ``prompt``, ``search``: :mod:`agentic_rag.rollout.settings`), so a setting has one name, one
default and one check wherever it is used.

A field is declared with :func:`setting`: its default, its help (which is also its command-line flag's help and
its line in ``--describe``), and what a value must be (``choices``, which may be a callable returning a
registry's names; ``min`` / ``max``; ``check``, a function returning a problem or None). Rules that involve
several fields of a section are its ``problems(at)`` method (``at(name)`` is the field's dotted name).

:func:`load` builds a config from, in increasing precedence:

1. the defaults;
2. ``beneath``: values that apply only where nothing else sets them (the settings a trained adapter records);
3. the YAML file (``${VAR}`` and ``${VAR:-default}`` in its strings come from the environment);
4. environment variables named by the config (``env_vars``: variable -> dotted name);
5. ``overrides``: ``dotted.name=value`` (``--set``, and flags, which become overrides), a value read as YAML
   unless the setting is text.

It reports every problem at once (:class:`SettingsError`): unknown keys with the closest known one (or, for a
setting an earlier version named otherwise, the config class's ``MOVED`` map, its name now), wrong types,
values out of range and the sections' rules, each with its dotted name and where the value came from, and then
nothing has loaded yet. :func:`describe` lists every setting with its resolved value and help; :func:`add_flags`
makes command-line flags from the fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from .errors import UserError

T = TypeVar("T")
Check = Callable[[Any], "str | None"]


class SettingsError(UserError):
    """Every problem of a config at once, one per line, each with its setting's dotted name."""

    def __init__(self, problems: Sequence[str], source: str = "settings"):
        self.problems = list(problems)
        self.source = source
        super().__init__(f"{source}: {len(self.problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in
                                                                                     self.problems))


def setting(default: Any, help: str, *, choices: Sequence[str] | Callable[[], Sequence[str]] | None = None,  # noqa: A002
            min: float | None = None, max: float | None = None, check: Check | None = None,  # noqa: A002
            env: str | None = None) -> Any:
    """A dataclass field with its help text and what its value must be (see the module docstring). ``env``: the
    environment variable that sets it (documented in ``.env_format``)."""
    meta = {"help": help, "choices": choices, "min": min, "max": max, "check": check, "env": env}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type, help: str = "") -> Any:  # noqa: A002
    """A field holding a section (a settings dataclass) with its default values."""
    return field(default_factory=cls, metadata={"help": help})


# ------------------------------------------------------------------------------------------------ types


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _list_of_sections(tp: Any) -> type | None:
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp) or (None,)
        return item if _is_section(item) else None
    return None


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in typing.get_args(tp) else "")
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return f"a list of {type_name(item)}"
    if origin is dict:
        return "a mapping"
    return {str: "text", int: "an integer", float: "a number", bool: "true or false"}.get(tp, getattr(
        tp, "__name__", str(tp)))


# 1e-5, 3E+2: YAML 1.2 numbers that YAML 1.1 (PyYAML) leaves as strings unless they hold a dot
_SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _typed(value: Any, tp: Any) -> tuple[bool, Any]:
    """``value`` as the annotation ``tp`` takes it: strict (``true`` is no count, ``"5"`` no number), except that
    an integer is a number, a number given for text is that text, and scientific notation without a dot
    (``1e-5``, which PyYAML's YAML 1.1 reads as text) is the number it spells."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            return type(None) in args, None
        for arg in args:
            if arg is type(None):
                continue
            ok, v = _typed(value, arg)
            if ok:
                return True, v
        return False, value
    if tp is Any:
        return True, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
            return True, float(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if tp is str:
        ok = isinstance(value, (str, int, float)) and not isinstance(value, bool)
        return ok, str(value) if ok else value
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            return False, value
        out = []
        for x in value:
            ok, v = _typed(x, item)
            if not ok:
                return False, value
            out.append(v)
        return True, out
    if origin is dict:
        return isinstance(value, dict), value
    return True, value


def _is_text(tp: Any) -> bool:
    """Text, or optional text: a ``--set`` value for it is taken as written, not parsed as YAML."""
    return tp is str or (typing.get_origin(tp) in (typing.Union, types.UnionType)
                         and set(typing.get_args(tp)) == {str, type(None)})


# ------------------------------------------------------------------------------------------------ building


@dataclass
class _Build:
    problems: list[str] = field(default_factory=list)
    rejected: set[str] = field(default_factory=set)  # dotted names whose value was unusable (defaults stand in)
    origins: dict[str, str] = field(default_factory=dict)  # dotted name -> where its value came from
    moved: Mapping[str, str] = field(default_factory=dict)  # settings of earlier versions -> their names now

    def problem(self, where: str, text: str) -> None:
        name = where
        while name and name not in self.origins:  # inside a list or mapping given whole: the whole's origin
            parent = re.sub(r"(\.[^.\[\]]+|\[\d+\])$", "", name)
            if parent == name:
                break
            name = parent
        origin = self.origins.get(name)
        shown = f" (from {origin})" if origin and origin != "the config file" else ""
        self.problems.append(text + shown)


def _build(cls: type, data: Any, path: str, b: _Build) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        b.problem(path, f"{path or 'the config'} must be a mapping of settings (key: value lines), got "
                        f"{type(data).__name__}")
        b.rejected.add(path)
        return cls()
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            if where in b.moved:
                b.problem(where, f"{where} is now {b.moved[where]}: move it there")
                continue
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; the settings here are: {', '.join(fields)}"
            b.problem(where, f"{where} is not a setting{hint}")
            continue
        tp = hints[key]
        if _is_section(tp):
            kwargs[key] = _build(tp, value, where, b)
            continue
        item = _list_of_sections(tp)
        if item is not None:
            if not isinstance(value, list):
                b.problem(where, f"{where} must be a list, got {type(value).__name__}")
                b.rejected.add(where)
                continue
            kwargs[key] = [_build(item, v, f"{where}[{i}]", b) for i, v in enumerate(value)]
            continue
        ok, typed = _typed(value, tp)
        if not ok:
            b.problem(where, f"{where} must be {type_name(tp)}, got {value!r}")
            b.rejected.add(where)
            continue
        kwargs[key] = typed
    return cls(**kwargs)


def _field_problems(obj: Any, path: str, b: _Build) -> None:
    """Each field's own rules (choices, range, check), then the section's ``problems(at)``, recursively."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        where = f"{path}.{f.name}" if path else f.name
        value = getattr(obj, f.name)
        if _is_section(hints[f.name]):
            _field_problems(value, where, b)
            continue
        if _list_of_sections(hints[f.name]) is not None:
            for i, item in enumerate(value):
                _field_problems(item, f"{where}[{i}]", b)
            continue
        if where in b.rejected or value is None:
            continue
        meta = f.metadata
        choices = meta.get("choices")
        if callable(choices):
            choices = tuple(choices())
        if choices is not None:
            values = value if isinstance(value, list) else [value]
            for v in values:
                if v not in choices:
                    close = difflib.get_close_matches(str(v), [str(c) for c in choices], n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    b.problem(where, f"{where} must be one of {', '.join(map(str, choices))}; got {v!r}{hint}")
        low, high = meta.get("min"), meta.get("max")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if low is not None and value < low:
                b.problem(where, f"{where} must be >= {low:g}, got {value:g}")
            elif high is not None and value > high:
                b.problem(where, f"{where} must be <= {high:g}, got {value:g}")
        check = meta.get("check")
        if check is not None and (text := check(value)):
            shown = "" if "got" in text or "known" in text else f", got {value!r}"
            b.problem(where, f"{where} {text}{shown}")
    rules = getattr(obj, "problems", None)
    if callable(rules):
        def at(name: str) -> str:
            return f"{path}.{name}" if path else name

        for text in rules(at):
            if _mentions_any(text, b.rejected):
                continue  # a rule about a value already reported as unusable: said once is enough
            names = re.findall(r"(?<![\w.])[a-z_]+(?:\.[a-z_0-9]+)+", text)
            origin = next((b.origins[n] for n in names if b.origins.get(n, "the config file") != "the config file"),
                          None)
            b.problems.append(text + (f" (from {origin})" if origin else ""))


def _mentions_any(text: str, dotted_names: set[str]) -> bool:
    return any(d and re.search(rf"(?<![\w.]){re.escape(d)}(?![\w])", text) for d in dotted_names)


# ------------------------------------------------------------------------------------------------ sources

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(value: Any, where: str, problems: list[str], env: Mapping[str, str]) -> Any:
    """``${VAR}`` / ``${VAR:-default}`` in every string of a YAML tree, from ``env``."""
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}" if where else str(k), problems, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", problems, env) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if env.get(name):
            return env[name]
        if default is not None:
            return default
        problems.append(f"{where}: environment variable {name} is not set (set it in .env or the environment)")
        return ""

    return _VAR.sub(sub, value)


def leaf_type(cls: type, dotted: str) -> Any:
    """The annotation of the setting ``dotted`` of ``cls``; KeyError when there is no such setting."""
    tp: Any = cls
    for name in dotted.split("."):
        if not _is_section(tp) or name not in {f.name for f in dataclasses.fields(tp)}:
            raise KeyError(dotted)
        tp = _hints(tp)[name]
    return tp


def known_names(cls: type, prefix: str = "") -> list[str]:
    """Every setting's dotted name (sections' leaves), in declaration order."""
    out = []
    for f in dataclasses.fields(cls):
        tp = _hints(cls)[f.name]
        out += known_names(tp, f"{prefix}{f.name}.") if _is_section(tp) else [f"{prefix}{f.name}"]
    return out


def parse_value(cls: type, dotted: str, raw: str) -> Any:
    """A command-line value for the setting ``dotted``: as written for text, else read as YAML (``null``,
    numbers, ``true``, lists)."""
    tp = leaf_type(cls, dotted)
    if _is_text(tp):
        return None if raw.strip() in ("null", "~") and tp is not str else raw
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for name in parents:
        if not isinstance(node.get(name), dict):
            node[name] = {}
        node = node[name]
    node[leaf] = value


def _has_dotted(tree: Mapping[str, Any], dotted: str) -> bool:
    node: Any = tree
    for name in dotted.split("."):
        if not isinstance(node, Mapping) or name not in node:
            return False
        node = node[name]
    return True


def get_dotted(tree: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """The value at the dotted key (``algorithm.max_steps``) of a nested mapping, ``default`` where it is absent."""
    if not _has_dotted(tree, dotted):
        return default
    node: Any = tree
    for name in dotted.split("."):
        node = node[name]
    return node


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key written twice in one mapping: PyYAML keeps the last silently, so a
    second ``rollout:`` section would drop the first one's settings without a word. A key a merge (``<<``)
    brings in may still be overridden, as YAML allows."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key_node.value!r} is written twice in one mapping (first on line "
                    f"{seen[key] + 1}): YAML would keep only the last", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML config file as a mapping, or :class:`SettingsError` naming the file."""
    path = Path(path)
    if path.is_dir():
        raise SettingsError([f"{path} is a folder, not a YAML config file"], str(path))
    if not path.is_file():
        raise SettingsError([f"no such config file: {path}"], str(path))
    try:
        with path.open(encoding="utf-8") as stream:  # (a stream: a YAML error then names the file and line)
            data = yaml.load(stream, Loader=_UniqueKeyLoader) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SettingsError([f"not valid YAML: {exc}"], str(path)) from None
    if not isinstance(data, dict):
        raise SettingsError([f"the config must be a mapping of settings, got {type(data).__name__}"], str(path))
    return data


@dataclass
class Loaded:
    """What :func:`load` read: the config tree as given (file, environment, overrides) and where each value
    came from, for :func:`describe` and the override log lines."""

    tree: dict[str, Any]
    origins: dict[str, str]


def gather(cls: type, *, path: str | os.PathLike | None = None, data: Mapping[str, Any] | None = None,
           env: Mapping[str, str] | None = None, env_vars: Mapping[str, str] | None = None,
           overrides: Sequence[str] = (), problems: list[str] | None = None) -> Loaded:
    """Steps 3-5 of :func:`load`: the tree of values given (file or ``data``, environment, overrides) and their
    origins. Problems of the overrides themselves (no such setting, no ``=``) go to ``problems``."""
    problems = [] if problems is None else problems
    env = os.environ if env is None else env
    tree: dict[str, Any] = dict(read_yaml(path) if path is not None else (data or {}))
    origins: dict[str, str] = {}

    def note(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                note(v, f"{prefix}{k}.")
        if prefix:
            origins[prefix[:-1]] = "the config file"

    note(tree, "")
    tree = _expand(tree, "", problems, env)
    for var, dotted in (env_vars or {}).items():
        if env.get(var):
            _set_dotted(tree, dotted, parse_value(cls, dotted, env[var]))
            origins[dotted] = f"{var} in the environment or .env"
    names = known_names(cls)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"--set {item!r}: expected NAME=VALUE, e.g. rollout.max_searches=2")
            continue
        try:
            value = parse_value(cls, key, raw)
        except KeyError:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else " (--describe lists every setting)"
            problems.append(f"--set {key}: no such setting{hint}")
            continue
        _set_dotted(tree, key, value)
        origins[key] = f"--set {key}"
    return Loaded(tree, origins)


def load(cls: type[T], *, path: str | os.PathLike | None = None, data: Mapping[str, Any] | None = None,
         env: Mapping[str, str] | None = None, env_vars: Mapping[str, str] | None = None,
         overrides: Sequence[str] = (), beneath: Mapping[str, tuple[Any, str]] | None = None,
         source: str | None = None, extra_problems: Callable[[T], list[str]] | None = None) -> tuple[T, Loaded]:
    """Build ``cls`` from the sources of the module docstring and check all of it; returns the config and what
    was given. ``beneath``: ``{dotted: (value, origin)}`` taken only where nothing given sets it.
    ``extra_problems(config)``: checks that need more than the fields (files on disk), run with the others.
    Raises :class:`SettingsError` listing every problem."""
    problems: list[str] = []
    source = source or (str(path) if path is not None else "settings")
    if data is not None and not isinstance(data, Mapping):
        raise SettingsError([f"the config must be a mapping of settings (key: value lines), got "
                             f"{type(data).__name__}"], source)
    given = gather(cls, path=path, data=data, env=env, env_vars=env_vars, overrides=overrides, problems=problems)
    tree = given.tree
    origins = dict(given.origins)
    for dotted, (value, origin) in (beneath or {}).items():
        if not _has_dotted(tree, dotted):
            _set_dotted(tree, dotted, value)
            origins[dotted] = origin
    b = _Build(problems=problems, origins=origins, moved=getattr(cls, "MOVED", {}))
    config = _build(cls, tree, "", b)
    if "" not in b.rejected:
        _field_problems(config, "", b)
        if extra_problems is not None:
            # a file check of a value already reported as unusable (checked on the default): said once is enough
            b.problems.extend(p for p in extra_problems(config) if not _mentions_any(p, b.rejected))
    if b.problems:
        raise SettingsError(b.problems, source)
    return config, Loaded(tree, origins)


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def section_from_dict(cls: type[T], data: Mapping[str, Any], source: str) -> T:
    """One section from a mapping (a saved adapter's settings), checked like a config file's."""
    config, _ = load(cls, data=dict(data), env={}, source=source)
    return config


# ------------------------------------------------------------------------------------------------ describing


def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any, dataclasses.Field]]:
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if _is_section(hints[f.name]):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value, f


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57] + "...")
    if is_dataclass_list(value):
        return yaml.safe_dump([dataclasses.asdict(v) for v in value], default_flow_style=True, width=1 << 16).strip()
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip().removesuffix("\n...")


def is_dataclass_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(dataclasses.is_dataclass(v) for v in value)


def describe(config: Any, origins: Mapping[str, str] | None = None) -> list[str]:
    """Every setting, one per line: ``dotted.name  value  help`` (and where a value that is not the default came
    from, in brackets)."""
    rows = []
    for dotted, value, f in _leaves(config):
        origin = (origins or {}).get(dotted)
        help_text = f.metadata.get("help", "")
        if origin:
            help_text += f" [from {origin}]"
        rows.append((dotted, _shown(value), help_text))
    width = max((len(r[0]) for r in rows), default=0)
    vwidth = min(24, max((len(r[1]) for r in rows), default=0))
    return [f"{name:<{width}}  {value:<{vwidth}}  {text}" for name, value, text in rows]


# ------------------------------------------------------------------------------------------------ flags


def flag_name(dotted: str) -> str:
    return "--" + dotted.rsplit(".", 1)[-1].replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, cls: type, sections: Sequence[str] | None = None,
              env_prefix: str | None = None) -> dict[str, str]:
    """A flag for each setting of ``cls`` (of the named ``sections`` only, when given), named after the setting's
    own name (``rollout.max_searches`` -> ``--max-searches``), with the setting's help; returns ``{flag dest:
    dotted name}``. Values are kept as text; :func:`flag_overrides` turns the ones given into overrides, so they
    are read and checked like ``--set``. With ``env_prefix`` each flag's help names its environment variable."""
    dests: dict[str, str] = {}
    for dotted in known_names(cls):
        if sections is not None and dotted.split(".", 1)[0] not in sections:
            continue
        tp = leaf_type(cls, dotted)
        f = _field_of(cls, dotted)
        help_text = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else None
        if env_prefix:
            help_text += f" (env {env_var(env_prefix, dotted)})"
        help_text += f"; default: {_shown(default)}"
        dest = "setting__" + dotted.replace(".", "__")
        kw: dict[str, Any] = {"dest": dest, "default": None, "help": help_text.replace("%", "%%")}
        if tp is bool:
            kw.update(nargs="?", const="true", metavar="BOOL")
        else:
            kw["metavar"] = dotted.rsplit(".", 1)[-1].upper()
        parser.add_argument(flag_name(dotted), **kw)
        dests[dest] = dotted
    return dests


def env_var(prefix: str, dotted: str) -> str:
    return prefix + dotted.rsplit(".", 1)[-1].upper()


def _field_of(cls: type, dotted: str) -> dataclasses.Field:
    *parents, leaf = dotted.split(".")
    tp: Any = cls
    for name in parents:
        tp = _hints(tp)[name]
    return next(f for f in dataclasses.fields(tp) if f.name == leaf)


def flag_overrides(args: argparse.Namespace, dests: Mapping[str, str]) -> list[str]:
    """The overrides (``dotted=value``) of the flags given on the command line."""
    return [f"{dotted}={getattr(args, dest)}" for dest, dotted in dests.items() if getattr(args, dest) is not None]
