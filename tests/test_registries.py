"""Registries beside what they name (DESIGN.md): a name is written once, in its registry, and everything else looks
it up there; no list copied to dodge an import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rag.training.algorithms import (
    KL_IN_RETURN,
    ORDER_NEUTRAL_LOSSES,
    PRESETS,
    algorithm_args,
    algorithm_names,
    get_preset,
)

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "agentic_rag"
ALGORITHMS_MODULE = Path("training/algorithms.py")
# string constants equal to a preset name that are not a preset: (module, value) -> what they are
NOT_PRESETS = {
    (Path("training/trainer.py"), "grpo"): "save_trained_settings: written_by, the kind of training (grpo or sft)",
    (Path("demo/quickstart.py"), "grpo"): "the quick start's run label (grpo or control)",
    (Path("demo/wiki.py"), "grpo"): "the wiki quick start's run label and summary key (adapters: sft, grpo, control)",
    (Path("training/train.py"), "grpo"): "the progress line's tag ([grpo] step i/N; [sft] for SFT)",
    (Path("demo/results.py"), "grpo"): "the quick start's run labels it reads (eval/seedN-grpo, eval/seedN-control)",
}


def string_constants(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant of a parsed module except docstrings and other bare string statements."""
    bare = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare]


def names_written_outside(registry: Path, names: set[str]) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE)
        if module == registry:
            continue
        for node in string_constants(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if node.value in names and (module, node.value) not in NOT_PRESETS:
                found.append(f"{module}:{node.lineno} writes {node.value!r}")
    return found


def test_algorithm_names_are_written_only_in_their_registry():
    names = set(algorithm_names())
    written = names_written_outside(ALGORITHMS_MODULE, names)
    assert not written, ("algorithm names are written in agentic_rag/training/algorithms.py only; elsewhere look "
                         "them up there (get_preset(name).kl_in_return, DEFAULT_ALGORITHM, ...):\n"
                         + "\n".join(written))


def test_the_scan_sees_a_name_written_elsewhere_and_skips_docstrings():
    tree = ast.parse('"""dapo"""\ndef f(name):\n    """grpo"""\n    return name == "dapo" or name in ("gspo",)\n')
    assert sorted(n.value for n in string_constants(tree)) == ["dapo", "gspo"]


def test_the_registry_is_consistent_and_loads_without_torch():
    assert tuple(PRESETS) == algorithm_names() and all(p.name == name for name, p in PRESETS.items())
    for name in algorithm_names():
        assert get_preset(name).help and algorithm_args(name)["loss_type"] == get_preset(name).loss_type
    # order neutrality is a property of TRL's loss: presets sharing a loss type agree on it
    for loss in {p.loss_type for p in PRESETS.values()}:
        assert len({p.order_neutral for p in PRESETS.values() if p.loss_type == loss}) == 1, loss
    assert "bnpo" not in ORDER_NEUTRAL_LOSSES and set(ORDER_NEUTRAL_LOSSES) <= {p.loss_type for p in PRESETS.values()}
    assert all(get_preset(n).kl_in_return for n in KL_IN_RETURN)
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'; choose one of grpo, ") as e:
        get_preset("ppo")
    assert all(name in str(e.value) for name in algorithm_names())
    code = "import sys, agentic_rag.training.algorithms; assert 'torch' not in sys.modules and 'trl' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------- scorers: rewards and metrics

SCORER_REGISTRY = Path("rewards/registry.py")
# names logged as a reward that a config does not list: (module, value) -> what they are
NOT_REWARDS = {
    (Path("training/rewards.py"), "curriculum"): "CurriculumReward: the whole reward when curriculum.enabled",
}
# where a reward name is written: the first argument of these calls, and ``spec.name == "..."``
REWARD_CALLS = {"RewardSpec", "MetricReward", "make_reward", "reward_params"}
# where a metric name is written: the metric list of these calls, ``metrics=[...]``, ``"..." in metrics`` and
# the name argument of metric_value
METRIC_CALLS = {"example_metrics": 2, "summarize": 1, "metric_value": 1}
# module-level mappings and tuples holding names: (module, variable) -> "reward" or "metric"
NAME_TABLES = {
    (Path("training/rewards.py"), "BUILDERS"): "reward",
    (Path("training/rewards.py"), "METRICS"): "reward",
    (Path("evaluation/metrics.py"), "METRIC_FUNCS"): "metric",
    (Path("evaluation/report.py"), "LABELS"): "metric",
    (Path("evaluation/config.py"), "DEFAULT_METRICS"): "metric",
    (Path("demo/quickstart.py"), "REWARD_WEIGHTS"): "metric",  # evaluation metrics weighted as the training rewards
}


def _strings(node: ast.AST | None) -> list[ast.Constant]:
    """The string constants of a literal: a string, or a list / tuple / set of them, or a dict's keys."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [e for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return []


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def scorer_names_written(tree: ast.AST, module: Path) -> list[tuple[str, ast.Constant]]:
    """``(kind, constant)`` for every reward or metric name the module writes in a place that names one."""
    found: list[tuple[str, ast.Constant]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _callee(node)
            if name in REWARD_CALLS and node.args:
                found += [("reward", c) for c in _strings(node.args[0])]
            if name in METRIC_CALLS and len(node.args) > METRIC_CALLS[name]:
                found += [("metric", c) for c in _strings(node.args[METRIC_CALLS[name]])]
            found += [("metric", c) for k in node.keywords if k.arg == "metrics" for c in _strings(k.value)]
            if (name == "__init__" and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call)
                    and _callee(node.func.value) == "super" and module == Path("training/rewards.py")):
                found += [("reward", c) for c in _strings(node.args[0] if node.args else None)]  # a _Named reward
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = node.left, node.comparators[0]
            if isinstance(node.ops[0], ast.Eq) and isinstance(left, ast.Attribute) and left.attr == "name" \
                    and isinstance(left.value, ast.Name) and left.value.id == "spec":
                found += [("reward", c) for c in _strings(right)]
            if isinstance(node.ops[0], ast.In) and isinstance(right, ast.Name) and right.id == "metrics":
                found += [("metric", c) for c in _strings(left)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(getattr(node, "value", None), ast.AST):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                kind = NAME_TABLES.get((module, t.id)) if isinstance(t, ast.Name) else None
                if kind:
                    found += [(kind, c) for c in _strings(node.value)]
    return found


def scorer_name_problems(tree: ast.AST, module: Path) -> list[str]:
    from agentic_rag.rewards.registry import RENAMED, metric_names, reward_names

    known = {"reward": set(reward_names()), "metric": set(metric_names())}
    problems = [f"{module}:{c.lineno} names the {kind} {c.value!r}, which the registry does not list as a {kind}"
                for kind, c in scorer_names_written(tree, module)
                if c.value not in known[kind] and (module, c.value) not in NOT_REWARDS]
    exported = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                for c in _strings(node.value)}  # a function's name (accuracy.exact_match), not a scorer's
    problems += [f"{module}:{c.lineno} writes {c.value!r}, renamed {RENAMED[c.value]!r}"
                 for c in string_constants(tree) if c.value in RENAMED and id(c) not in exported]
    return problems


def test_every_reward_and_metric_name_written_in_src_is_in_the_scorer_registry():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE)
        if module != SCORER_REGISTRY:
            problems += scorer_name_problems(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), module)
    assert not problems, ("reward and metric names are defined in agentic_rag/rewards/registry.py; a name written "
                          "elsewhere must be one of its names:\n" + "\n".join(problems))


def test_the_scorer_scan_sees_a_wrong_name_in_each_place():
    code = ('__all__ = ["exact_match"]\nRewardSpec("exact_match")\nexample_metrics(p, g, ["em", "format"])\n'
            'EvalConfig(metrics=["acc"])\n'
            'x = spec.name == "bleu"\ny = "rouge" in metrics\nmetric_value(m, "formatted")\nRewardSpec("f1")\n'
            'METRIC_FUNCS = {"em": 1, "chrf": 2}\n')
    problems = scorer_name_problems(ast.parse(code), Path("evaluation/metrics.py"))
    for bad in ("reward 'exact_match'", "metric 'format'", "metric 'acc'", "reward 'bleu'", "metric 'rouge'",
                "metric 'formatted'", "metric 'chrf'", "writes 'exact_match', renamed 'em'"):
        assert any(bad in p for p in problems), (bad, problems)
    assert len(problems) == 8, problems  # and nothing about em or f1


def test_the_scorer_registry_is_consistent_and_loads_without_torch():
    from agentic_rag.rewards import registry

    assert tuple(registry.SCORERS) == tuple(dict.fromkeys(registry.SCORERS))
    assert all(s.name == name and s.help and (s.reward or s.metric) for name, s in registry.SCORERS.items())
    assert registry.reward_names() == ("em", "f1", "cover_em", "cover_em_tokens", "judge", "choice", "format",
                                       "retrieval", "ragas", "overlong")
    assert registry.metric_names() == ("em", "f1", "cover_em", "judge", "choice", "well_formed")
    assert registry.judge_fallback_names() == ("em", "f1", "cover_em", "cover_em_tokens")
    assert registry.reward_params("format") == {"partial": bool} and registry.reward_params("em") == {}
    assert {n: registry.reward_params(n) for n in registry.reward_names() if registry.reward_params(n)} == {
        "cover_em_tokens": {"max_extra_tokens": int}, "format": {"partial": bool},
        "ragas": {"metric": str, "fallback": str}, "overlong": {"max_tokens": int, "cache_tokens": int}}
    assert all(new in registry.SCORERS and old not in registry.SCORERS for old, new in registry.RENAMED.items())
    assert registry.get_scorer("well_formed").metric and not registry.get_scorer("format").metric
    with pytest.raises(ValueError, match=r"unknown scorer 'cover-em' \(did you mean 'cover_em'\?\); known scorers: "
                                         r"em, f1, "):
        registry.get_scorer("cover-em")
    with pytest.raises(ValueError, match=r"unknown metric 'format' \('format' was renamed 'well_formed'\)"):
        registry.get_scorer("format", kind="metric")
    with pytest.raises(ValueError, match=r"unknown reward 'exact_match' \('exact_match' was renamed 'em'\)"):
        registry.reward_params("exact_match")
    assert registry.metric_value({"format": 0.5}, "well_formed") == 0.5
    assert registry.metric_value({"format": 0.5, "well_formed": 1.0}, "well_formed") == 1.0
    assert registry.metric_value({"em": 1.0}, "f1") is None
    code = ("import sys, agentic_rag.rewards.registry, agentic_rag.jsonl; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
