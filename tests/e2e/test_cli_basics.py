"""The ``autom`` command as a user runs it: migrate, and the settings error path."""

from __future__ import annotations

from tests.support.proc import clean_env, run_autom


def test_migrate_on_a_fresh_database_twice(empty_dsn, tmp_path):
    first = run_autom("migrate", env=clean_env(DATABASE_URL=empty_dsn), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "applied 0001_events_jobs" in first.stdout
    second = run_autom("migrate", env=clean_env(DATABASE_URL=empty_dsn), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "database is up to date"


def test_run_without_required_settings_names_each_on_a_line_exit_1(tmp_path):
    result = run_autom("run", env=clean_env(DATABASE_URL="postgresql://nowhere/x", PORT="x"), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "autom: PORT must be a whole number, got 'x'",
        "autom: missing required setting TELEGRAM_BOT_TOKEN",
        "autom: missing required setting TELEGRAM_ALERT_CHAT_ID",
        "autom: missing required setting TELEGRAM_WEBHOOK_SECRET",
        "autom: missing required setting SITE_WEBHOOK_SECRET",
        "autom: missing required setting ADMIN_TOKEN",
    ]
    assert "Traceback" not in result.stderr


def test_malformed_number_is_one_line_exit_1(tmp_path):
    result = run_autom("migrate", env=clean_env(DATABASE_URL="postgresql://x/y", WORKERS="many"), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == "autom: WORKERS must be a whole number, got 'many'"


def test_dotenv_in_the_working_directory_is_read(tmp_path):
    (tmp_path / ".env").write_text("DATABASE_URL=postgresql://x/y\nPORT=notaport\n")
    result = run_autom("migrate", cwd=tmp_path)
    assert result.returncode == 1
    assert "PORT must be a whole number" in result.stderr


def test_unreachable_database_is_one_line_exit_1(tmp_path):
    env = clean_env(DATABASE_URL="postgresql://postgres@127.0.0.1:1/none?connect_timeout=1")
    result = run_autom("migrate", env=env, cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_usage_exits_2(tmp_path):
    assert run_autom("frobnicate", cwd=tmp_path).returncode == 2
    assert run_autom(cwd=tmp_path).returncode == 2
    help_text = run_autom("--help", cwd=tmp_path)
    assert help_text.returncode == 0 and "migrate" in help_text.stdout


def test_run_on_a_port_in_use_is_one_line_exit_1(empty_dsn, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = clean_env(DATABASE_URL=empty_dsn, TELEGRAM_BOT_TOKEN="1:x", TELEGRAM_ALERT_CHAT_ID="1",
                        TELEGRAM_WEBHOOK_SECRET="s", SITE_WEBHOOK_SECRET="s", ADMIN_TOKEN="a" * 24,
                        HOST="127.0.0.1", PORT=str(port), TELEGRAM_API="http://127.0.0.1:9")
        result = run_autom("run", env=env, cwd=tmp_path)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"autom: 127.0.0.1:{port} is already in use: set PORT to a free port"
    assert "Traceback" not in result.stderr


def test_a_database_error_is_one_line_for_every_command(empty_dsn, tmp_path):
    """The database refuses the statements (a read-only session, set from DATABASE_URL's
    options, which win over autom's): one line, exit 1, no traceback."""
    import psycopg

    read_only = psycopg.conninfo.make_conninfo(empty_dsn, options="-c default_transaction_read_only=on")
    for command in (["migrate"], ["failed"], ["retry", "1"]):
        result = run_autom(*command, env=clean_env(DATABASE_URL=read_only), cwd=tmp_path)
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("autom: "), (command, result.stderr)


def test_version(tmp_path):
    import importlib.metadata

    result = run_autom("--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"autom {importlib.metadata.version('autom')}"


def _subcommands() -> list[tuple[list[str], object]]:
    """(argv prefix, parser) of every leaf subcommand, nested ones (telegram ...) included."""
    import argparse

    from autom.cli import build_parser

    found: list[tuple[list[str], object]] = []

    def walk(prefix: list[str], parser: argparse.ArgumentParser) -> None:
        groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not groups:
            found.append((prefix, parser))
        for group in groups:
            for name, child in group.choices.items():
                walk([*prefix, name], child)

    walk([], build_parser())
    return found


def test_every_subcommand_help_names_its_settings_and_shows_an_example():
    import re

    from autom.config import setting_names

    known = set(setting_names())
    leaves = _subcommands()
    assert len(leaves) >= 7
    for argv, parser in leaves:
        text = parser.format_help()
        where = "autom " + " ".join(argv)
        assert "\nsettings (" in text, f"{where} --help: name the settings it reads (cli.py, help_epilog)"
        settings_part, _, example_part = text.partition("\nsettings (")[2].partition(":\n")[2].partition("\nexample")
        named = set(re.findall(r"\b[A-Z][A-Z0-9_]+\b", settings_part))
        assert named <= known, f"{where}: unknown settings {sorted(named - known)}"
        assert named or settings_part.strip().startswith("none"), f"{where}: name the settings, or say none"
        assert f"autom {' '.join(argv)}" in example_part, f"{where}: show an example"
        if argv == ["run"]:
            assert named == known, "autom run reads every setting"


def test_help_as_a_user_runs_it(tmp_path):
    result = run_autom("failed", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "DATABASE_URL (required)" in result.stdout and "autom failed --limit 50" in result.stdout


def test_role_is_checked_on_the_command_line_and_in_the_environment(tmp_path):
    bad_flag = run_autom("run", "--role", "both", cwd=tmp_path)
    assert bad_flag.returncode == 2 and "invalid choice: 'both'" in bad_flag.stderr
    bad_env = run_autom("migrate", env=clean_env(DATABASE_URL="postgresql://x/y", ROLE="both"), cwd=tmp_path)
    assert bad_env.returncode == 1
    assert bad_env.stderr.strip() == "autom: ROLE must be one of all, intake, worker, got 'both'"
