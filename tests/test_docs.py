"""The docs match the code: every environment variable read is documented (the documented commands:
test_docs_site.py)."""

from __future__ import annotations

import re

from conftest import ROOT

ENV_READ = re.compile(r"""(?:environ(?:\.get)?\(|environ\[|getenv\()\s*["']([A-Z][A-Z0-9_]+)["']""")
SHELL_READ = re.compile(r"\$\{([A-Z][A-Z0-9_]+):?-[^}]*\}")  # ${VAR:-default}: a variable read from outside
# Set by the platform or by launchers, not by users: standard names, documented by their owners.
SKIP = {"OPENAI_API_KEY", "VIRTUAL_ENV", "CONDA_PREFIX", "DEBIAN_FRONTEND", "PATH", "HOME",
        "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "WORLD_SIZE", "RANK",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE", "XDG_CACHE_HOME"}


def documented() -> set[str]:
    return {line.split("=", 1)[0] for line in (ROOT / ".env_format").read_text().splitlines()
            if line and not line.startswith("#") and "=" in line}


def read_by_code() -> set[str]:
    from agentic_rag.training.config import ENV_OVERRIDES

    names: set[str] = set(ENV_OVERRIDES)
    for path in list((ROOT / "src").rglob("*.py")) + list((ROOT / "service").rglob("*.py")):
        names |= set(ENV_READ.findall(path.read_text()))
    for path in (ROOT / "script").rglob("*.sh"):
        names |= set(SHELL_READ.findall(path.read_text()))
    return names - SKIP


def test_every_environment_variable_the_code_reads_is_documented():
    missing = read_by_code() - documented()
    assert not missing, f"read by the code but not documented in .env_format: {sorted(missing)}"


def test_env_format_has_no_values():
    for line in (ROOT / ".env_format").read_text().splitlines():
        if line and not line.startswith("#"):
            assert line.endswith("="), f".env_format must not carry values: {line}"


def test_readme_quick_start_and_ci_use_the_same_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash script/quickstart.sh" in readme and "bash script/test.sh" in readme
    assert "bash script/test.sh" in ci
