"""The site source takes a signed HTML form (application/x-www-form-urlencoded) through the real intake."""

from __future__ import annotations

import logging

import pytest

from autom import App
from autom.testing import hmac_signature, open_testbed

SECRET = "site-secret-of-the-form-test"


async def test_a_signed_form_becomes_one_site_form_job_and_a_resend_none(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="autom")
    body = b"id=lead-7&email=ada%40example.com&message=Hello+there"
    headers = {"content-type": "application/x-www-form-urlencoded", "x-signature": hmac_signature(SECRET, body)}
    async with open_testbed(App(), database_url=dsn, settings={"site_webhook_secret": SECRET}) as bed:
        first = await bed.post("site", body, headers)
        again = await bed.post("site", body, headers)
        wrong = await bed.post("site", body, {**headers, "x-signature": "sha256=" + "0" * 63})
        [job] = first.jobs
        assert job.kind == "site.form"
        assert job.payload == {"id": "lead-7", "email": "ada@example.com", "message": "Hello there"}
        assert job.recipient == "site:ada@example.com"
        run = await bed.run(job.id)
    assert first.status in (200, 201, 202), first
    assert again.jobs == [] and again.status < 300, again  # the same id: stored once, no second job
    assert wrong.status == 401  # and its log line says what was wrong
    assert any("x-signature header's sha256 signature has 63 hex digits, not 64" in r.getMessage()
               for r in caplog.records)
    assert run.status == "done", run.error
