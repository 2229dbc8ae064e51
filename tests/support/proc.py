"""Running the real ``autom`` command in tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

AUTOM = str(Path(sys.executable).parent / "autom")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any autom setting of the developer's, plus ``extra``."""
    from autom.config import setting_names

    env = {k: v for k, v in os.environ.items() if k not in set(setting_names())}
    env.update(extra)
    return env


def run_autom(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``autom ARGS`` to completion and capture its output."""
    return subprocess.run(
        [AUTOM, *args], env=env if env is not None else clean_env(), cwd=cwd,
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )
