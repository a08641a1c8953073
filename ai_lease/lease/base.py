"""The lease store protocol and the answers its operations give.

A store keeps one :class:`~ai_lease.job.JobState` per job key. Each operation is atomic
(one Lua script on Redis, one ``BEGIN IMMEDIATE`` transaction on SQLite) and judges time
by the store's own clock:

``acquire``  -> :class:`Acquired` (you own it, with a new fencing token)
              | :class:`Following` (someone else does, until ``lease_expires_at``)
              | :class:`Finished` (DONE with its result, or FAILED with its reason)
``renew``    -> :class:`Renewal` (refused unless the fence is current, the job RUNNING,
              the lease live and progress fresh within the stage budget + grace); with a
              ``checkpoint`` it also stores where a resumable stream stood, in the same
              atomic, fenced write (a refused renewal writes nothing)
``release``  step down; ``commit`` the one result (fenced, idempotent); ``fail`` terminally;
``report_stall`` store where the work is stuck; ``cancel`` a job by key (not fenced: its
owner's next renewal is refused and its commit rejected); ``get``; ``wait`` for a change;
``list_jobs`` for people (not a hot path): with ``on_corrupt``, a record that is not ours
is skipped and reported to it instead of failing the whole listing. ``list_page`` and
``count_jobs`` (:class:`JobListing`) are the bounded listing a dashboard refreshes.

The records that ``acquire`` (when it grants or refuses a lease) and ``commit``/``fail``
(on a fresh write) return may leave the big fields out — ``spec``, other owners'
``result``, ``stall_snapshot`` — so an input or a result never crosses the network twice;
``get`` and a ``Finished`` answer always carry everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ai_lease.errors import CorruptSink, InputError
from ai_lease.job import JobState, RunFacts
from ai_lease.lease.storable import exact
from ai_lease.refusal import Refusal
from ai_lease.timeouts import StreamLimits

__all__ = [
    "AcquireOutcome",
    "Acquired",
    "Fence",
    "Finished",
    "Following",
    "JobListing",
    "JobPage",
    "LeaseStore",
    "Renewal",
    "require_store",
]

CHECKPOINT_LIMIT = StreamLimits().max_answer_bytes + 64 * 1024
"""The largest checkpoint (UTF-8 bytes) a renewal stores: a whole answer's text at the
default stream limit, plus room for its JSON envelope. A larger one is refused."""


def checkpoint_problem(fence: Fence, checkpoint: str | None) -> str | None:
    """What is wrong with storing ``checkpoint`` (None: nothing): over :data:`CHECKPOINT_LIMIT`."""
    if checkpoint is None:
        return None
    # isascii() is a flag read: no encoding on the usual path
    size = len(checkpoint) if checkpoint.isascii() else len(checkpoint.encode())
    if size <= CHECKPOINT_LIMIT:
        return None
    return (
        f"checkpoint for job {fence.key!r} is {size} bytes, over the limit of "
        f"{CHECKPOINT_LIMIT}: not stored"
    )


def check_checkpoint(fence: Fence, checkpoint: str | None, *, nul: bool = True) -> None:
    """Raise :class:`~ai_lease.errors.InputError` for a checkpoint over
    :data:`CHECKPOINT_LIMIT`, or one the store cannot keep exactly (``nul``: whether it holds
    a NUL; :func:`~ai_lease.lease.storable.exact`): nothing is sent, not the renewal either."""
    if checkpoint is not None:
        exact("renew", fence.key, "checkpoint", checkpoint, nul=nul)
    problem = checkpoint_problem(fence, checkpoint)
    if problem is not None:
        raise InputError(f"{problem}, nor the renewal sent; renew without it")


@dataclass(frozen=True, slots=True)
class Fence:
    """What an owner presents with every write: the job key and its (token, owner id) pair.

    The one fence type: stores take it, answers and errors (``Renewal.current``,
    ``FencingRejected.held``/``.current``, ``LeaseLost.held``) carry it.

    >>> str(Fence("job-1", "a", 11))
    "token 11 of 'a'"
    """

    key: str
    owner_id: str
    token: int

    @classmethod
    def of(cls, job: JobState) -> Fence:
        """The fence a record holds (owner ``""`` when it never had one)."""
        return cls(job.key, job.owner_id or "", job.token)

    def holds(self, job: JobState) -> bool:
        """Whether the record's (token, owner id) is exactly this fence's."""
        return job.token == self.token and job.owner_id == self.owner_id

    def __str__(self) -> str:
        return f"token {self.token} of {self.owner_id!r}"


@dataclass(frozen=True, slots=True)
class Acquired:
    """The caller owns the job. ``takeover`` is true when another node held it before
    (a retry by the same node is an attempt, not a takeover); ``cause`` then says why it
    was free: ``expired`` (its lease lapsed), ``released`` or ``stalled``."""

    fence: Fence
    takeover: bool
    job: JobState
    cause: str | None = None


@dataclass(frozen=True, slots=True)
class Following:
    """Another owner holds a live lease; wait for its result or for the lease to lapse."""

    job: JobState

    @property
    def owner_id(self) -> str | None:
        return self.job.owner_id

    @property
    def lease_remaining(self) -> float:
        return self.job.lease_remaining


@dataclass(frozen=True, slots=True)
class Finished:
    """The job is terminal: DONE (``job.result``) or FAILED (``job.last_error``)."""

    job: JobState


AcquireOutcome = Acquired | Following | Finished


@dataclass(frozen=True, slots=True)
class Renewal:
    """The answer to a renewal.

    ``ok`` false means the lease is not extended; ``reason`` is one of
    :data:`~ai_lease.refusal.RENEWAL_REFUSALS` (``missing``, ``not_owner``,
    ``not_running``, ``expired``, ``no_progress``), and ``current`` the fence the store
    holds. ``stalled`` with ``ok`` true happens only under the ``alert`` stall policy:
    renewed, but the miss was recorded and counted.
    """

    ok: bool
    reason: Refusal | None = None
    lease_remaining: float = 0.0
    stalled: bool = False
    current: Fence | None = None


@runtime_checkable
class LeaseStore(Protocol):
    """Where leases, progress and results live. See the module docstring for the answers."""

    async def acquire(
        self,
        key: str,
        owner_id: str,
        *,
        ttl: float,
        max_no_progress: float,
        stall_policy: str = "expire",
        fingerprint: str | None = None,
        max_attempts: int | None = None,
        renew_interval: float | None = None,
    ) -> AcquireOutcome:
        """``renew_interval`` (the owner's) is kept in the record, for its health."""
        ...

    async def renew(
        self,
        fence: Fence,
        *,
        ttl: float,
        stage: str | None,
        progress_version: int,
        max_no_progress: float,
        grace: float,
        checkpoint: str | None = None,
    ) -> Renewal:
        """``checkpoint`` (None: keep the stored one) is written with the renewal, fenced
        like it; one over :data:`CHECKPOINT_LIMIT` raises ``InputError``, sending nothing."""
        ...

    async def release(
        self,
        fence: Fence,
        *,
        error: str | None = None,
        snapshot: str | None = None,
        interrupted: bool = False,
    ) -> bool:
        """Step down. ``interrupted``: the owner was cancelled (Ctrl-C, a shutdown), not
        failed: the attempt is handed back uncounted and ``last_error`` is kept."""
        ...

    async def commit(
        self,
        fence: Fence,
        result: str,
        *,
        finish_reason: str | None = None,
        facts: RunFacts | None = None,
    ) -> JobState:
        """The job's one result, fenced and idempotent; ``finish_reason`` (the model's, e.g.
        ``"length"`` for a capped answer) and ``facts`` (what ran) are kept in the record."""
        ...

    async def fail(
        self, fence: Fence, reason: str, *, kind: str | None = None, facts: RunFacts | None = None
    ) -> JobState:
        """End the job FAILED with ``reason`` (fenced), keeping ``kind`` (a
        :class:`~ai_lease.failure.FailureKind`; None: the one ``reason`` names,
        :func:`~ai_lease.failure.kept_kind`) and ``facts``."""
        ...

    async def report_stall(self, fence: Fence, stage: str | None, snapshot: str) -> bool: ...

    async def cancel(self, key: str, reason: str = "cancelled") -> JobState | None:
        """End job ``key`` CANCELLED unless it has already ended; return its record (None
        for an unknown key). Followers wake; the owner is fenced out."""
        ...

    async def get(self, key: str) -> JobState | None: ...

    async def wait(self, key: str, timeout: float) -> None: ...

    async def list_jobs(
        self, *, status: str | None = None, limit: int = 100, on_corrupt: CorruptSink | None = None
    ) -> list[JobState]:
        """Up to ``limit`` jobs (newest first where the store knows), optionally one status;
        a corrupt record raises :class:`CorruptRecord`, or with ``on_corrupt`` is skipped
        and reported to it."""
        ...

    async def aclose(self) -> None: ...


# -- the jobs' listing for a dashboard: pages off the stores' own indexes ----------------------


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of jobs: newest first (``created_at`` descending, then key descending), and
    the cursor of the next page (pass it as ``after=``; None: this was the last page).

    A page may hold fewer than ``limit`` jobs and still have a next cursor when a filter
    matched few of the entries one call may read (Redis reads a bounded number of index
    entries per call): follow the cursor to go on. A job's record in a page may leave out
    the big fields (``spec``, ``result``, ``stall_snapshot``), as ``acquire``'s do.
    """

    jobs: list[JobState]
    next_cursor: str | None


@runtime_checkable
class JobListing(Protocol):
    """Pages of jobs and per-status counts, each call bounded work on the store's indexes
    (both built-in stores implement it).

    >>> page = await store.list_page(status="RUNNING", limit=50)   # doctest: +SKIP
    >>> more = await store.list_page(status="RUNNING", after=page.next_cursor)  # doctest: +SKIP
    """

    async def list_page(
        self,
        *,
        status: str | None = None,
        prefix: str | None = None,
        after: str | None = None,
        limit: int = 50,
        on_corrupt: CorruptSink | None = None,
    ) -> JobPage:
        """Up to ``limit`` (1..500, else ValueError) jobs after cursor ``after`` (a
        ValueError if it is not one a page gave), of one ``status`` (a Status value, else
        ValueError) and whose key starts with ``prefix`` (literally: no wildcards); an empty
        status or prefix filters nothing. A corrupt record is skipped, reported to
        ``on_corrupt`` (without one, logged), never failing the page."""
        ...

    async def count_jobs(self) -> dict[str, int]:
        """How many jobs the store holds per status (statuses with none left out)."""
        ...


def require_store(store: Any, door: str, *, takes_url: bool = False) -> LeaseStore:
    """``store``, if it is one; else the error every door gives for a missing or wrong store
    (``connect()``, ``Runner``, ``Worker``, ``open_store()``): a :class:`TypeError` naming the
    door and what it takes (``takes_url``: a store URL too). A URL that names no store is a
    :class:`~ai_lease.errors.ConfigError` instead (:func:`~ai_lease.stores.open_store`).

    >>> require_store(None, "Runner()")
    Traceback (most recent call last):
    TypeError: Runner(): store is None: pass a store object (ai_lease.open_store(url) opens one)
    """
    if store is None or isinstance(store, str | bytes) or not hasattr(store, "acquire"):
        what = "None" if store is None else f"a {type(store).__name__}"
        wanted = (
            "a store URL (sqlite:///jobs.db, redis://…, postgresql://…) or a store object"
            if takes_url
            else "a store object (ai_lease.open_store(url) opens one)"
        )
        raise TypeError(f"{door}: store is {what}: pass {wanted}")
    return store  # type: ignore[no-any-return]
