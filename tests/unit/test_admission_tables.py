"""The admission's pure parts: who the client is, token buckets, failing clients, refusal bursts."""

from __future__ import annotations

import ipaddress
import logging

import pytest

from autom.admission import FailingClients, RefusalLog, TokenBuckets, client_key, retry_after

PROXIES = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128"))


@pytest.mark.parametrize(
    ("peer", "xff", "client"),
    [
        ("203.0.113.5", ["198.51.100.1"], "203.0.113.5"),  # untrusted peer: its XFF is ignored
        ("10.0.0.2", ["198.51.100.1"], "198.51.100.1"),
        ("10.0.0.2", ["1.1.1.1, 198.51.100.1, 10.0.0.9"], "198.51.100.1"),  # the first untrusted from the right
        ("10.0.0.2", ["1.1.1.1", "198.51.100.1"], "198.51.100.1"),  # repeated headers join in order
        ("10.0.0.2", ["10.0.0.7, 10.0.0.8"], "10.0.0.7"),  # all trusted: the leftmost
        ("10.0.0.2", [], "10.0.0.2"),  # no XFF: the proxy itself
        ("10.0.0.2", ["garbage, 10.0.0.3"], "garbage"),  # not an address: not one of our proxies
        ("::1", ["2001:db8::1"], "2001:db8::1"),
        (None, ["1.2.3.4"], "unknown"),
    ],
)
def test_the_client_is_the_first_untrusted_address(peer: str | None, xff: list[str], client: str) -> None:
    assert client_key(peer, xff, PROXIES) == client


def test_without_trusted_proxies_the_peer_is_the_client() -> None:
    assert client_key("10.0.0.2", ["1.2.3.4"], ()) == "10.0.0.2"


def test_a_bucket_allows_its_burst_then_its_rate() -> None:
    buckets = TokenBuckets(rate=10, burst=20)
    now = 100.0
    assert all(buckets.take("a", now) == 0.0 for _ in range(20))
    wait = buckets.take("a", now)
    assert 0 < wait <= 0.1 + 1e-9
    assert buckets.take("b", now) == 0.0  # another client is not affected
    assert buckets.take("a", now + wait) == 0.0  # one token back after the wait
    assert buckets.take("a", now + wait) > 0
    # over one second at the rate: 10 more
    later = now + wait + 1.0
    assert sum(buckets.take("a", later) == 0.0 for _ in range(30)) == 10


def test_full_buckets_are_pruned_and_the_table_is_bounded() -> None:
    buckets = TokenBuckets(rate=10, burst=20, max_keys=100)
    for i in range(1000):
        buckets.take(f"c{i}", 0.0)
    assert len(buckets) <= 100
    buckets.prune(10.0)
    assert len(buckets) == 0


def test_more_than_twenty_failures_in_ten_seconds_block_for_sixty() -> None:
    failing = FailingClients()
    for i in range(20):
        assert not failing.failed("x", 1000.0 + i * 0.1)
    assert failing.blocked_for("x", 1002.0) == 0.0
    assert failing.failed("x", 1002.0)  # the 21st
    assert failing.blocked_for("x", 1002.0) == pytest.approx(60.0)
    assert failing.blocked_for("x", 1061.9) > 0
    assert failing.blocked_for("x", 1062.0) == 0.0
    assert failing.blocked_for("y", 1002.0) == 0.0


def test_failures_spread_beyond_the_window_do_not_block() -> None:
    failing = FailingClients()
    for i in range(100):
        assert not failing.failed("x", i * 0.6)  # 16-17 in any 10 s
    failing.prune(1000.0)
    assert failing.blocked_for("x", 1000.0) == 0.0


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert retry_after(0.001) == 1
    assert retry_after(1.0) == 1
    assert retry_after(1.2) == 2
    assert retry_after(59.5) == 60


def test_a_refusal_burst_logs_one_line_at_its_start_and_one_at_its_end(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="autom.admission")
    refusals = RefusalLog(quiet=10.0)
    for i in range(500):
        refusals.refused("rate", "site", 100.0 + i * 0.01, "client 1.2.3.4 is over CLIENT_RATE")
    refusals.refused("backlog", "stripe", 101.0, "full")
    refusals.flush(105.0)  # not quiet long enough
    assert len(caplog.records) == 2
    refusals.flush(120.0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    assert lines[0] == "refusing site deliveries (rate): client 1.2.3.4 is over CLIENT_RATE"
    assert "500 site deliveries refused (rate)" in " ".join(lines)
    refusals.refused("rate", "site", 130.0, "again")  # a new burst
    assert len(caplog.records) == 5
