"""One environment holds the whole stack, at the pinned versions."""

from __future__ import annotations

import configparser
import json
import subprocess
import sys
from importlib.metadata import version

from packaging.requirements import Requirement

from conftest import ROOT


def pinned() -> dict[str, str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    pins = {}
    for line in cfg["options"]["install_requires"].strip().splitlines():
        req = Requirement(line.strip())  # "swanlab[dashboard]==0.10.3": the package is swanlab
        specs = list(req.specifier)
        pins[req.name] = specs[0].version if len(specs) == 1 and specs[0].operator == "==" else ""
    return pins


def test_every_dependency_is_pinned_and_installed_at_its_pin():
    pins = pinned()
    assert pins and all(pins.values()), "every install_requires entry must be pinned with =="
    wrong = {n: (v, version(n)) for n, v in pins.items() if version(n).split("+")[0] != v}
    assert not wrong, f"installed versions differ from the pins: {wrong}"


def test_constraints_agree_with_pins():
    constraints = dict(line.split("==", 1) for line in (ROOT / "constraints.txt").read_text().split()
                       if "==" in line)
    lower = {k.lower().replace("_", "-"): v for k, v in constraints.items()}
    for name, ver in pinned().items():
        assert lower.get(name.lower()) == ver, f"constraints.txt pins {name} at {lower.get(name.lower())}, not {ver}"


def test_the_whole_stack_imports_together_in_a_fresh_interpreter():
    code = r"""
import json, os
from agentic_rag.search.jvm import run_in_jvm
from jnius import autoclass
java = run_in_jvm(lambda: autoclass("java.lang.System").getProperty("java.version"))
import pyserini.search.lucene, ragas, trl, peft, bitsandbytes, deepspeed, swanlab, faiss, fastapi, transformers
import swanboard  # swanlab watch: the local dashboard
from ragas.metrics import *  # noqa
print(json.dumps({"java": java, "openai_key_left_behind": "OPENAI_API_KEY" in os.environ,
                  "trl": trl.__version__, "peft": peft.__version__, "deepspeed": deepspeed.__version__}))
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "OPENAI_API_KEY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert int(info["java"].split(".")[0]) >= 21
    assert info["openai_key_left_behind"] is False, "the placeholder key for pyserini's import must not leak"
    assert (info["trl"], info["peft"], info["deepspeed"]) == ("1.16.0", "0.21.2", "0.19.8")
