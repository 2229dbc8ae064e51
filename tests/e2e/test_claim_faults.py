"""Claims made ahead, attempts and at-most-once kinds, with real ``autom run`` processes.

Each process loads a user module whose handlers note every run they start (job id,
attempt, process id) in a file, then sleep RUN_SECONDS: a run is counted where it
starts, whatever happens to the process after. The queue is read from the test's own
database connection; jobs are enqueued with SQL ``autom_enqueue`` (as from outside).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from tests.support.processes import AutomProcess, AutomProcesses
from tests.support.service import wait_until
from tests.support.telegram_stub import TelegramStub

RUNS_MODULE = '''
import os

import trio

from autom import App, HandlerContext, Job

app = App()


def note(job: Job) -> None:
    with open(os.environ["RUNS_FILE"], "a") as runs:
        runs.write(f"{job.id} {job.attempts} {os.getpid()}\\n")


@app.handler("slow", max_attempts=2)
async def slow(ctx: HandlerContext, job: Job) -> None:
    note(job)
    await trio.sleep(float(os.environ["RUN_SECONDS"]))


@app.handler("tick")
async def tick(ctx: HandlerContext, job: Job) -> None:
    pass


if os.environ.get("AT_MOST_ONCE"):
    @app.handler("charge", at_most_once=True)
    async def charge(ctx: HandlerContext, job: Job) -> None:
        note(job)
        await trio.sleep(float(os.environ["RUN_SECONDS"]))
'''


class World:
    """The test's processes, all loading ``RUNS_MODULE`` and noting runs in one file."""

    def __init__(self, procs: AutomProcesses, dsn: str, stub: TelegramStub) -> None:
        self.procs, self.dsn, self.stub = procs, dsn, stub
        self.runs_file = procs.folder / "runs.txt"
        self.runs_file.touch()

    async def start(self, run_seconds: float, **settings: str) -> AutomProcess:
        for number in range(1, len(self.procs.started) + 3):  # starts may run concurrently
            folder = self.procs.folder / f"autom-{number}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "runs_automations.py").write_text(RUNS_MODULE)
        # a 4 s lease: a run is stopped only if a renewal is answered more than 3.6 s after it was
        # sent (a 2 s lease was at load 6, the suite's own under pytest -n)
        env = {"AUTOM_APP": "runs_automations:app", "RUNS_FILE": str(self.runs_file),
               "RUN_SECONDS": str(run_seconds), "JOB_LEASE_SECONDS": "4", "WORKERS": "2", **settings}
        return await self.procs.start(dsn=self.dsn, telegram_url=self.stub.url, **env)

    def runs(self) -> list[tuple[int, int, int]]:
        """(job id, attempt, pid) of every run started so far."""
        return [(int(a), int(b), int(c)) for a, b, c in
                (line.split() for line in self.runs_file.read_text().splitlines() if line.strip())]


async def enqueue(db: Any, kind: str, count: int, **fields: Any) -> list[int]:
    jobs = [{"kind": kind, "payload": {"n": i}, **fields} for i in range(count)]
    rows = await db.fetch_all("select autom_enqueue as id from autom_enqueue(%s::jsonb)", [json.dumps(jobs)])
    return [r["id"] for r in rows]


async def jobs_of(db: Any, kind: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch_all(
        "select id, status, attempts, last_error from jobs where kind = %s order by id", [kind])]


async def wait_finished(db: Any, kind: str, timeout: float) -> list[dict[str, Any]]:
    async def finished() -> list[dict[str, Any]] | None:
        jobs = await jobs_of(db, kind)
        return jobs if all(j["status"] in ("done", "failed", "cancelled") for j in jobs) else None

    return list(await wait_until(finished, timeout=timeout, interval=0.1))


async def warm_up(db: Any, replicas: int) -> None:
    """Fast runs first, so each replica has measured a fast pace (it did hoard slow jobs then)."""
    await enqueue(db, "tick", 20 * replicas)
    await wait_finished(db, "tick", timeout=20)


async def held(db: Any, since: Any = None) -> int:
    """How many jobs claimed since ``since`` (database time; None: ever) are held now."""
    return int(await db.fetch_val(
        "select count(*) from jobs where status = 'running' and claimed_at >= coalesce(%s::timestamptz, '-infinity')"
        " and locked_until > now()", [since]))


async def test_two_kill_9s_burn_no_attempt_of_a_job_that_never_ran(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses
) -> None:
    """max_attempts=2, two processes killed while they hold jobs claimed ahead: no job fails
    that did not run twice, and each job's attempts are its runs started."""
    world = World(procs, dsn, stub)
    for round_ in range(2):
        since = await db.fetch_val("select now()")
        before = len(world.runs())
        proc = await world.start(run_seconds=60)
        if round_ == 0:
            await warm_up(db, 1)
            ids = await enqueue(db, "slow", 10, max_attempts=2)
        # two runs going (WORKERS=2) and a claim made ahead of them
        await wait_until(lambda b=before: len(world.runs()) >= b + 2, timeout=20, interval=0.05)
        await wait_until(lambda s=since: _at_least(held(db, s), 3), timeout=20, interval=0.05)
        proc.kill()
        await proc.wait(timeout=5)
    await world.start(run_seconds=0.05)
    jobs = await wait_finished(db, "slow", timeout=60)

    runs = Counter(job_id for job_id, _, _ in world.runs())
    assert sorted(j["id"] for j in jobs) == sorted(ids)
    for job in jobs:
        assert job["attempts"] == runs[job["id"]], (job, runs[job["id"]])
        if job["status"] == "failed":  # only a job whose two runs were both lost
            assert runs[job["id"]] == 2 and "attempts exhausted" in job["last_error"], (job, runs)
        else:
            assert job["status"] == "done", job
    # the attempt each run saw was its number among the job's runs
    for job_id in ids:
        seen = [attempt for j, attempt, _ in world.runs() if j == job_id]
        assert seen == list(range(1, len(seen) + 1)), (job_id, seen)


async def _at_least(count: Any, n: int) -> bool:
    return bool(await count >= n)


async def test_two_replicas_share_slow_jobs(dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses) -> None:
    """20 one-second jobs, two replicas of 2 workers each: neither runs more than 60 % of them
    (one took 38 of 40 when claims ahead followed a pace measured on millisecond runs)."""
    world = World(procs, dsn, stub)
    replicas = [await world.start(run_seconds=1.0), await world.start(run_seconds=1.0)]
    await warm_up(db, 2)
    ids = await enqueue(db, "slow", 20)
    jobs = await wait_finished(db, "slow", timeout=60)
    assert {j["status"] for j in jobs} == {"done"}
    runs = world.runs()
    assert sorted(job_id for job_id, _, _ in runs) == sorted(ids)  # each ran once
    share = Counter(pid for _, _, pid in runs)
    assert set(share) <= {p.pid for p in replicas}
    assert max(share.values()) <= 12, share


async def test_an_at_most_once_job_lost_with_its_worker_fails_with_one_alert_and_never_runs_again(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses
) -> None:
    world = World(procs, dsn, stub)
    first = await world.start(run_seconds=60, AT_MOST_ONCE="1")
    (job_id,) = await enqueue(db, "charge", 1)
    await wait_until(lambda: len(world.runs()) == 1, timeout=20, interval=0.05)
    first.kill()
    await first.wait(timeout=5)

    second = await world.start(run_seconds=0.05, AT_MOST_ONCE="1")
    (job,) = await wait_finished(db, "charge", timeout=30)
    assert (job["status"], job["last_error"], job["attempts"]) == (
        "failed", "lost with its worker (at-most-once)", 1), job  # one run started
    assert [r[0] for r in world.runs()] == [job_id]  # its handler ran once
    alerts = await db.fetch_all("select error from alerts where job_id = %s", [job_id])
    assert [a["error"] for a in alerts] == ["lost with its worker (at-most-once)"]
    assert second.logged("job failed for good", job_id=job_id)


async def test_a_shutdown_fails_a_started_at_most_once_run_and_gives_back_one_not_started(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses
) -> None:
    """The decision: a run a shutdown cut short may have done its effect, so it is not run
    again (failed, one alert); a job claimed ahead that never started goes back, uncounted."""
    world = World(procs, dsn, stub)
    proc = await world.start(run_seconds=60, AT_MOST_ONCE="1", WORKERS="1", SHUTDOWN_GRACE_SECONDS="30")
    first, second = await enqueue(db, "charge", 2)
    await wait_until(lambda: len(world.runs()) == 1, timeout=20, interval=0.05)
    await wait_until(lambda: _at_least(held(db), 2), timeout=20, interval=0.05)
    proc.terminate()
    await proc.wait_logged("shutting down: draining")
    proc.terminate()  # the second signal cancels the running handler
    assert await proc.wait(timeout=10) == 0

    jobs = {j["id"]: j for j in await jobs_of(db, "charge")}
    started = world.runs()[0][0]
    other = second if started == first else first
    assert (jobs[started]["status"], jobs[started]["last_error"]) == (
        "failed", "interrupted by shutdown (at-most-once)"), jobs
    assert (jobs[other]["status"], jobs[other]["attempts"]) == ("pending", 0), jobs
    alerts = await db.fetch_all("select job_id from alerts")
    assert [a["job_id"] for a in alerts] == [started]
