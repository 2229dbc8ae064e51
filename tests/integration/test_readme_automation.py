"""The README's "Write your first automation" code works as printed (a user copies it)."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from autom import App
from autom.testing import hmac_signature, open_testbed, running_http_stub

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_module() -> str:
    section = README.read_text().split("## Write your first automation", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_user_code_is_under_40_lines() -> None:
    assert len(readme_module().splitlines()) < 40


async def test_the_readme_automation_runs_as_printed(dsn: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "leads.py").write_text(readme_module())
    monkeypatch.syspath_prepend(str(tmp_path))
    async with running_http_stub() as crm:
        for name, value in {"CRM_URL": crm.url, "SALES_CHAT_ID": "-100", "CRM_FORM_SECRET": "form-secret"}.items():
            monkeypatch.setenv(name, value)
        sys.modules.pop("leads", None)
        app = importlib.import_module("leads").app
        assert isinstance(app, App)
        async with open_testbed(app, database_url=dsn) as bed:
            body = b'{"email": "ada@example.com", "name": "Ada"}'
            delivery = await bed.post("crm", body, {"X-Signature": hmac_signature("form-secret", body)})
            assert delivery.status == 202 and [job.kind for job in delivery.jobs] == ["crm.lead"]
            run = await bed.run(delivery.jobs[0].id)
        assert run.status == "done", run.error
        assert run.once_keys == ["crm:ada@example.com"]
        run.assert_enqueued("telegram.send", chat_id="-100", text="New lead: ada@example.com")
        [request] = crm.requests
        assert request["json"]["email"] == "ada@example.com"
        assert request["headers"]["idempotency-key"] == f"autom-{run.id}-crm"
    sys.modules.pop("leads", None)
