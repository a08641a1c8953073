"""Structured logs: key, token, stage and idle time on every job line; never a secret."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ai_lease import JobFailed, LeaseStore, ProviderError, StoreUnavailable, open_store
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.observe.logs import JobLogger, configure_logging, fan_out, redact, remove_handlers
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.testing.scripted import Raise, ScriptedProvider

API_KEY = "sk-CANARY-abcdef123456"
REDIS_URL = "redis://default:CANARY-pa@ss/word@cache.internal:6379/0"
BEARER = "Authorization: Bearer CANARY.tok-en_123"
CANARY = "CANARY"

# Kinds the lease keeper and the pipeline emit: they know the stage and the idle time.
KEEPER_AND_STAGE_KINDS = {"stage", "stage_done", "first_token", "renewed", "stalled"}


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def captured(request: pytest.FixtureRequest) -> Iterator[tuple[logging.Logger, Lines]]:
    """A private logger at DEBUG whose formatted lines are kept in a list."""
    logger = logging.getLogger(f"tests.logs.{request.node.name}")
    handler = Lines()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, handler
    logger.removeHandler(handler)


def stall_event(**overrides: Any) -> Event:
    fields: dict[str, Any] = dict(
        kind="stalled",
        key="report-42",
        owner_id="node-a#1.9f2c",
        token=7,
        stage="call_ai",
        idle_s=90.4137,
        detail="expire: stage 'call_ai' made no progress for 90.41s (budget 90s)",
    )
    return Event(**fields | overrides)


def test_text_line_carries_key_token_stage_and_idle(captured: Any) -> None:
    """A text line is compact: kind, key, token, owner, stage, idle, detail."""
    logger, handler = captured
    JobLogger(logger)(stall_event())
    assert handler.lines == [
        "stalled key=report-42 token=7 owner=node-a#1.9f2c stage=call_ai idle=90.41s "
        "expire: stage 'call_ai' made no progress for 90.41s (budget 90s)"
    ]


def test_json_line_carries_key_token_stage_and_idle(captured: Any) -> None:
    """A JSON line is one object with ts, level, event, key, token, stage and idle_s."""
    logger, handler = captured
    JobLogger(logger, json=True)(stall_event(value=None))
    line = orjson.loads(handler.lines[0])
    assert line["level"] == "WARNING" and line["event"] == "stalled"
    assert (line["key"], line["token"], line["stage"], line["idle_s"]) == (
        "report-42",
        7,
        "call_ai",
        90.41,
    )
    assert line["ts"].endswith("Z") and len(handler.lines) == 1


def test_canary_secrets_never_reach_a_line(captured: Any) -> None:
    """API keys, bearer tokens and URL passwords in details are redacted, text and JSON."""
    logger, handler = captured
    detail = f"401 from {REDIS_URL}: key {API_KEY}; {BEARER}; url ?password=CANARY1&db=0"
    for json in (False, True):
        JobLogger(logger, json=json)(stall_event(detail=detail))
    assert len(handler.lines) == 2
    for line in handler.lines:
        assert CANARY not in line, line
        assert "cache.internal:6379" in line  # the rest stays readable


async def test_a_provider_error_with_the_key_is_logged_redacted(
    sqlite_store: LeaseStore, captured: Any
) -> None:
    """A real run whose provider error echoes the API key logs it without the key."""
    logger, handler = captured
    error = ProviderError(f"HTTP 401: Incorrect API key provided: {API_KEY}", retryable=False)
    runner = Runner(
        sqlite_store,
        provider=ScriptedProvider([Raise(error)]),
        hooks=RunHooks(on_event=JobLogger(logger, json=True)),
    )
    with pytest.raises(JobFailed):
        await runner.run(Job("k", input="x"))
    lines = [orjson.loads(line) for line in handler.lines]
    assert any(line["event"] == "failed" and "sk-***" in line["detail"] for line in lines)
    assert all(CANARY not in orjson.dumps(line).decode() for line in lines)


async def test_every_job_line_has_key_and_token(sqlite_store: LeaseStore, captured: Any) -> None:
    """Through a real run every line names the job and its token; keeper and stage lines
    also name the stage and the idle time."""
    logger, handler = captured
    runner = Runner(
        sqlite_store,
        provider=ScriptedProvider(["a", "b"]),
        hooks=RunHooks(on_event=JobLogger(logger, json=True)),
    )
    await runner.run(Job("k", input="x"))
    lines = [orjson.loads(line) for line in handler.lines]
    assert {"acquired", "stage", "stage_done", "first_token", "committed"} <= {
        line["event"] for line in lines
    }
    for line in lines:
        assert {"key", "token", "stage", "idle_s"} <= line.keys()
        assert line["key"] == "k" and isinstance(line["token"], int), line
        if line["event"] in KEEPER_AND_STAGE_KINDS:
            assert line["stage"] and line["idle_s"] is not None, line
    (call,) = [line for line in lines if line["event"] == "model_call"]
    assert call["attrs"]["completion_tokens"] == 2


def test_repeated_following_polls_log_once(captured: Any) -> None:
    """A follower's identical polls log once; a new stage or owner logs again."""
    logger, handler = captured
    log = JobLogger(logger)
    poll = stall_event(kind="following", detail="12.0s of lease left")
    for _ in range(5):
        log(poll)
    log(stall_event(kind="following", stage="parse"))
    log(stall_event(kind="following", token=8, owner_id="node-b#1.0000"))
    assert len(handler.lines) == 3


def test_renewals_log_at_debug(captured: Any) -> None:
    """Routine renewals stay out of an INFO text log; trouble is a WARNING."""
    logger, handler = captured
    logger.setLevel(logging.INFO)
    log = JobLogger(logger)
    log(stall_event(kind="renewed", value=12.0))
    log(stall_event(kind="renew_refused", detail="not_owner"))
    assert len(handler.lines) == 1 and handler.lines[0].startswith("renew_refused")


def test_json_renewals_are_sampled_at_info_and_counted(captured: Any) -> None:
    """JSON mode: 25 renewals of a lease give lines for the 1st, 10th, 20th and (before the
    commit) the 25th, at INFO; their counts account for every renewal."""
    logger, handler = captured
    logger.setLevel(logging.INFO)
    log = JobLogger(logger, json=True)
    for _ in range(25):
        log(stall_event(kind="renewed", value=1.0))
    log(stall_event(kind="committed"))
    lines = [orjson.loads(line) for line in handler.lines]
    renewals = [line for line in lines if line["event"] == "renewed"]
    assert [line["event"] for line in lines] == ["renewed"] * 4 + ["committed"]
    assert {line["level"] for line in renewals} == {"INFO"}
    assert [line["attrs"]["renewals"] for line in renewals] == [1, 10, 20, 25]
    assert len(renewals) + sum(line["attrs"]["unlogged"] for line in renewals) == 25


def test_redact_forms() -> None:
    """Each secret form is masked; ordinary text is left alone."""
    assert redact(f"key={API_KEY}") == "key=sk-***"
    assert redact("redis://:hunter2@h:6379/0") == "redis://:***@h:6379/0"
    assert redact(REDIS_URL) == "redis://default:***@cache.internal:6379/0"
    assert redact("bearer abc.def") == "bearer ***"
    assert redact('{"api_key": "abc123"}') == '{"api_key": "***"}'
    assert redact("password: hunter2") == "password: ***"
    plain = "job 'k': fence token 11 of 'a' is stale (a newer owner took the job over)"
    assert redact(plain) == plain


def test_json_logging_wraps_other_records_too() -> None:
    """With configure_logging(json=True) every ai_lease record is a JSON line, redacted."""
    out = io.StringIO()
    events = configure_logging(json=True, stream=out)
    try:
        JobLogger(events)(stall_event())  # a text JobLogger still prints JSON here
        logging.getLogger("ai_lease.store").warning("cannot reach %s", REDIS_URL)
    finally:
        _unconfigure()
    first, second = (orjson.loads(line) for line in out.getvalue().splitlines())
    assert first["event"] == "stalled" and first["idle_s"] == 90.41
    assert second["event"] == "log" and CANARY not in second["detail"]


def _unconfigure() -> None:
    remove_handlers()
    root = logging.getLogger("ai_lease")
    root.propagate, root.level = True, logging.NOTSET


def test_a_held_back_renewal_is_stamped_with_its_own_time() -> None:
    """JSON mode through configure_logging: the last renewal, logged only when its lease
    ends (seconds later), carries the renewal's time, not the time of the lease's end."""
    out = io.StringIO()
    log = JobLogger(configure_logging(json=True, stream=out), json=True)
    renewed_at, ended_at = 1_800_000_029.617, 1_800_000_034.623
    try:
        log(stall_event(kind="renewed", value=1.0, at=renewed_at - 5.0))  # the 1st: a line
        log(stall_event(kind="renewed", value=1.0, at=renewed_at))  # held back
        log(stall_event(kind="committed", at=ended_at))
    finally:
        _unconfigure()
    stamps = [
        (line["event"], line["ts"]) for line in map(orjson.loads, out.getvalue().splitlines())
    ]
    assert stamps == [
        ("renewed", "2027-01-15T08:00:24.617Z"),
        ("renewed", "2027-01-15T08:00:29.617Z"),
        ("committed", "2027-01-15T08:00:34.623Z"),
    ]


def test_json_logging_takes_other_libraries_records_as_one_line_each() -> None:
    """With configure_logging(json=True) a library's multi-line warning (psycopg-pool's) and
    its traceback are one JSON line, and so is a warnings.warn."""
    out = io.StringIO()
    configure_logging(json=True, stream=out)
    try:
        try:
            raise OSError("connection refused\n\tIs the server running?")
        except OSError:
            logging.getLogger("psycopg.pool").warning(
                "error connecting:\n\tretrying", exc_info=True
            )
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a library's warning", UserWarning, stacklevel=1)
    finally:
        _unconfigure()
    lines = out.getvalue().splitlines()
    first, second = (orjson.loads(line) for line in lines)
    assert first["logger"] == "psycopg.pool" and first["detail"] == "error connecting:\n\tretrying"
    assert "Is the server running?" in first["exc"] and first["level"] == "WARNING"
    assert second["logger"] == "py.warnings" and "a library's warning" in second["detail"]


def test_fan_out_survives_a_failing_sink() -> None:
    """One sink raising does not stop the others (observability never breaks a job)."""
    seen: list[str] = []

    def broken(event: Event) -> None:
        raise RuntimeError("sink down")

    emit = fan_out(broken, None, lambda e: seen.append(e.kind))
    logging.getLogger("ai_lease.events").disabled = True
    try:
        emit(stall_event())
    finally:
        logging.getLogger("ai_lease.events").disabled = False
    assert seen == ["stalled"]


def test_worker_log_json(tmp_path: Path) -> None:
    """`ai-lease worker --log-json` writes one JSON object per line, job lines with key
    and token."""
    db = tmp_path / "ai-lease.db"

    async def submit() -> None:
        store = open_store(f"sqlite:///{db}")
        try:
            job = Job("json-job", input="One. Two. Three.", prompt_text="{{ input }}")
            await Runner(store).submit(job)
        finally:
            await store.aclose()

    asyncio.run(submit())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    worker = subprocess.Popen(
        [sys.executable, "-m", "ai_lease", "--store", f"sqlite:///{db}", "worker", "--log-json"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert worker.stderr is not None
    lines, deadline = [], time.monotonic() + 30
    while not any(line.get("event") == "committed" for line in lines):
        assert time.monotonic() < deadline, lines  # real: the worker is a subprocess
        text = worker.stderr.readline()
        assert text, "the worker exited early"
        lines.append(orjson.loads(text))
    worker.send_signal(signal.SIGTERM)
    _, rest = worker.communicate(timeout=30)
    lines += [orjson.loads(text) for text in rest.splitlines()]
    assert worker.returncode == 0
    assert {"worker_started", "acquired", "stage_done", "committed", "worker_stopped"} <= {
        line["event"] for line in lines
    }
    for line in lines:
        if line["key"] == "json-job":
            assert isinstance(line["token"], int), line


def _json_lines(handler: Lines) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in handler.lines]


async def test_json_log_has_every_lease_operation_at_info(
    sqlite_store: LeaseStore, captured: Any
) -> None:
    """A job renewed several times: its JSON log at INFO has the acquire, renewal lines
    accounting for every renewal the keeper made, and the commit, all with key and token."""
    from ai_lease import LeaseTimings, StageBudget
    from ai_lease.testing.scripted import Pause

    logger, handler = captured
    logger.setLevel(logging.INFO)
    renewed: list[Event] = []
    timings = LeaseTimings(
        ttl=1.0,
        renew_interval=0.1,
        op_timeout=0.08,
        poll_interval=0.05,
        self_fence_margin=0.2,
        stage_budgets={"call_ai": StageBudget(5, 10)},
    )
    sink = fan_out(
        JobLogger(logger, json=True), lambda e: renewed.append(e) if e.kind == "renewed" else None
    )
    provider = ScriptedProvider(["a", Pause(0.05)] * 25 + ["b"])
    record = await Runner(
        sqlite_store,
        provider=provider,
        config=RunConfig(timings=timings),
        hooks=RunHooks(on_event=sink),
    ).run(Job("k", input="x"))
    lines = [line for line in _json_lines(handler) if line["token"] == record.token]
    kinds = [line["event"] for line in lines]
    assert kinds[0] == "acquired" and "committed" in kinds
    assert all(line["level"] == "INFO" for line in lines)
    renewal_lines = [line for line in lines if line["event"] == "renewed"]
    assert len(renewed) > 1
    logged = len(renewal_lines) + sum(line["attrs"]["unlogged"] for line in renewal_lines)
    assert logged == len(renewed) == renewal_lines[-1]["attrs"]["renewals"]
    assert kinds.index("renewed") < kinds.index("committed")


class _LostCommitAnswers:
    """The real store, except every commit's answer is lost after the commit landed."""

    def __init__(self, store: LeaseStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def commit(self, fence: Any, result: str, **options: Any) -> Any:
        await self._store.commit(fence, result, **options)
        raise StoreUnavailable("test", "commit", "no answer within 0.1s")


async def test_json_log_says_when_a_commit_answer_arrived_late(
    sqlite_store: LeaseStore, captured: Any
) -> None:
    """An owner whose commit was applied after it gave up waiting (its lease could have
    lapsed) logs it at INFO: event commit_late with the committed token, then the DONE
    result is returned; it released nothing meanwhile."""
    from ai_lease import LeaseTimings, RetryPolicy

    logger, handler = captured
    logger.setLevel(logging.INFO)
    timings = LeaseTimings(
        ttl=2.0, renew_interval=0.5, op_timeout=0.2, poll_interval=0.05, self_fence_margin=0.5
    )
    runner = Runner(
        _LostCommitAnswers(sqlite_store),  # type: ignore[arg-type]
        provider=ScriptedProvider(["the answer"]),
        config=RunConfig(timings=timings, retry=RetryPolicy(attempts=3, initial=0.05)),
        hooks=RunHooks(on_event=JobLogger(logger, json=True)),
    )
    record = await runner.run(Job("k", input="x"))
    assert record.output == "the answer"
    [late] = [line for line in _json_lines(handler) if line["event"] == "commit_late"]
    assert late["level"] == "INFO" and late["key"] == "k" and late["token"] == record.token
    assert late["detail"] == "commit answer arrived late: applied"
    assert not [line for line in _json_lines(handler) if line["event"] == "released"]
