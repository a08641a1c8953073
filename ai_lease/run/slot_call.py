"""A model call under the fleet's provider limits (``[limits]``: :mod:`ai_lease.lease.call_limits`).

Before a call sends anything it takes one slot of every limit that matches it (its
provider, ``provider:model``, its base URL), from the store every worker shares; it holds
them until its answer has ended, then gives them back, which wakes the next waiter. A call
that matches no limit takes nothing and costs nothing.

**Waiting is its own budget.** While every slot is taken the call waits its turn (a higher
``Job.priority`` first, then first come, first served), at most the limit's ``max_wait``;
then the attempt fails with :class:`~ai_lease.lease.slots.SlotWaitTimeout` (a timeout: the job
is tried again). The wait is not charged to the call: the job is in a ``slot_wait`` step whose
no-progress budget is ``max_wait`` plus the lease's ttl, the stage's hard deadline is paused
and resumes with what it had left, and the stream's first-token clock starts only once the
call is sent.
The job says it waits: a ``slot_wait`` event ("waiting for a slot of X (3 ahead)") each time
its place changes, and one ``slot_wait`` entry in its timeline (``status``, the dashboard).

**Holding is progress-aware.** The slot is a lease with the job's ttl, renewed every
``lease.renew_interval`` only while the job made progress within its stage's budget: a
stream that stops making progress gives its slot back within that budget plus one renew
interval (:class:`~ai_lease.lease.slots.SlotStopped`; the stream guard's idle timeout
usually stops it first), and a SIGKILLed or paused owner's slot lapses within the ttl.
With ``lease.stall_policy = "alert"`` a stalled job keeps its slot, as it keeps its lease.

**A limit's ``rpm``** is a window of ``rpm`` places, each kept
:data:`~ai_lease.lease.call_limits.RATE_WINDOW_S`: after its concurrency slots, just before
sending, the call takes a place, waiting as above when the window is full; the place is never
given back and lapses by itself, so at most ``rpm`` calls start in any minute.

**A limit's ``tpm``** is a window of ``tpm`` tokens: last, the call takes a place weighing its
estimate (:func:`estimate_tokens`: the prompt's text at four characters a token, and its
``max_tokens``, as OpenAI counts a request against its limit); once the answer has ended the
place weighs what the answer's usage says was spent (fewer tokens free room for the waiters).
A request whose estimate is over the ``tpm`` could never be sent under it: its job fails
saying so. Under process isolation the prompt is built in the child, so the estimate is the
job's ``max_tokens`` alone until the usage corrects it.

**A success's rate-limit headers pause the limit too.** An answer saying nothing is left of
the key's requests or tokens (``x-ratelimit-remaining-*: 0``, Anthropic's
``anthropic-ratelimit-*-remaining: 0``: :mod:`~ai_lease.providers.rate_headers`) pauses
the call's limits until the reset it gives, so the fleet waits instead of meeting 429s
(another program on the same key spends it too). Not under process isolation: the answer is
read in the child.

**A 429 pauses the limit, not only the job.** A call refused with 429 and a retry hint
(``Retry-After``, ``retry-after-ms``, OpenAI's ``x-ratelimit-reset-*``, Gemini's
``retryDelay``: :func:`~ai_lease.providers.errors.retry_hint`) pauses every limit it held for
that long, in the store: no worker's call of those limits is sent until the pause ends (they
wait in line, saying so), so one 429 reaches the fleet instead of every worker finding its own.

**An adaptive limit** (``adaptive = true``) asks the store for this process's
:class:`~ai_lease.lease.call_limits.AdaptiveCap` instead of its ``concurrency``: halved when a
call is refused as overloaded (429, 503, 529), one more per round of calls that succeed, between
``min_concurrency`` and ``concurrency`` (a ``limit_adapted`` event says each change).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ai_lease.errors import ConfigError, JobSpecError, ProviderError, StoreError
from ai_lease.lease.call_limits import OVERLOADED, RATE_WINDOW_S, CallLimit
from ai_lease.lease.slot_hold import SlotHold
from ai_lease.lease.slots import MAX_UNITS, SlotGrant, SlotLost, SlotStopped, SlotStore
from ai_lease.providers.rate_headers import listening
from ai_lease.run.slot_tokens import HeadersHeard, TokenUse, estimate_tokens
from ai_lease.timeouts import StageBudget, StallPolicy

if TYPE_CHECKING:
    from ai_lease.providers.base import ChatRequest, Provider
    from ai_lease.run.context import StageContext

__all__ = ["TokenUse", "estimate_tokens", "holding_slots"]

log = logging.getLogger("ai_lease.slots")


@contextlib.asynccontextmanager
async def holding_slots(
    ctx: StageContext,
    provider: Provider,
    model: str | None,
    request: ChatRequest | None = None,
) -> AsyncIterator[TokenUse]:
    """Hold one slot of each limit the call matches while the block runs (none: nothing);
    the block says the tokens its answer spent through the :class:`TokenUse` it is given."""
    use = TokenUse()
    limits = ctx._run.limits.matching(provider.name, model, _base_url(provider))
    if not limits:
        yield use
        return
    store = ctx._run.store
    if not isinstance(store, SlotStore):
        raise ConfigError(f"[limits] {limits[0].name!r}: {store!r} keeps no provider slots")
    try:
        async with contextlib.AsyncExitStack() as held:
            weighed = await _take_all(ctx, store, limits, held, request)
            caps = ctx._run.limits.caps
            sent = {x.name: caps[x.name].epoch for x in limits if x.name in caps}
            heard = HeadersHeard(store, limits, lambda name, s: _said_spent(ctx, name, s))
            try:
                with listening(heard):
                    yield use
            except ProviderError as exc:
                if exc.status == 429:  # counted per limit: provider_rate_limited_total
                    await _rate_limited(ctx, store, limits, exc)
                if exc.status in OVERLOADED:
                    for name, epoch in sent.items():
                        _adapted(ctx, name, caps[name].overloaded(epoch), exc.status)
                raise
            finally:
                await heard.settled()
            for name in sent:
                _adapted(ctx, name, caps[name].succeeded(), None)
            await _reweigh(ctx, store, weighed, use.tokens or _ran_tokens(ctx))
    except SlotLost as exc:  # a renewal refused or none landed: the job's lease first
        if (lost := ctx.lease_lapsed()) is not None:
            raise lost from exc
        raise SlotStopped(exc.limit, exc.reason, ctx._run.keeper.timings.ttl) from exc


async def _take_all(
    ctx: StageContext,
    store: SlotStore,
    limits: tuple[CallLimit, ...],
    held: contextlib.AsyncExitStack,
    request: ChatRequest | None,
) -> list[_Slot]:
    """The limits' slots, then their rate windows' places (last: just before sending); the
    places in ``tpm`` windows, to be reweighed once the answer's usage is known."""
    for limit in limits:
        if limit.concurrency is not None:
            await held.enter_async_context(_Slot(ctx, store, limit))
    for limit in limits:
        if limit.rpm is not None:
            await held.enter_async_context(_Slot(ctx, store, limit, window="rpm"))
    weighed: list[_Slot] = []
    tpm = [limit for limit in limits if limit.tpm is not None]
    if tpm:
        estimate = estimate_tokens(request, ctx.job.max_tokens)
        for limit in tpm:
            assert limit.tpm is not None
            if estimate > limit.tpm:
                raise JobSpecError(
                    f"job {ctx.job.key!r}: its request is about {estimate} tokens (the prompt's "
                    f"estimate and max_tokens), over the tpm {limit.tpm} of limit "
                    f"{limit.name!r}: no minute could send it; lower max_tokens or raise tpm"
                )
            slot = _Slot(ctx, store, limit, window="tpm", weight=estimate)
            weighed.append(await held.enter_async_context(slot))
    return weighed


async def _reweigh(
    ctx: StageContext, store: SlotStore, weighed: list[_Slot], tokens: int | None
) -> None:
    """Each ``tpm`` place weighs what the answer spent (usage unknown: the estimate stays),
    best effort: the place lapses within a minute anyway."""
    for slot in weighed:
        grant = slot.grant
        if not tokens or grant is None or tokens == slot.weight:
            continue
        try:
            await store.reweigh_slot(grant.fence, min(max(1, tokens), MAX_UNITS))
        except StoreError as err:
            log.warning("%s: tokens not counted (%s); the estimate stays", slot.limit.name, err)


def _ran_tokens(ctx: StageContext) -> int | None:
    """The tokens the run's record says the call spent (a child's answer, under isolation)."""
    ran = ctx._run.ran
    spent = int(ran.get("prompt_tokens") or 0) + int(ran.get("completion_tokens") or 0)
    return spent or None


def _said_spent(ctx: StageContext, name: str, seconds: float) -> None:
    """A success's headers said the provider's limit is spent: the pause, said."""
    text = f"{name}: the provider says nothing is left for {seconds:.1f}s"
    ctx.say("rate_spent", text, value=seconds, attrs={"limit": name, "paused": seconds})


async def _rate_limited(
    ctx: StageContext, store: SlotStore, limits: tuple[CallLimit, ...], exc: ProviderError
) -> None:
    """Say the 429 per limit; with a retry hint, pause each limit (its slots and its rate
    window) in the store for that long, best effort: the job's own retry waits it anyway."""
    hint = exc.retry_after
    for limit in limits:
        paused = 0.0
        if hint:
            try:
                for name in limit.names:
                    paused = max(paused, await store.pause_slot(name, hint))
            except StoreError as err:
                log.warning("limit %s not paused after a 429 (%s)", limit.name, err)
        attrs: dict[str, float | int | str] = {"limit": limit.name}
        if paused:
            attrs["paused"] = round(paused, 3)
        ctx.say("rate_limited", str(exc)[:200], value=paused or None, attrs=attrs)


def _adapted(ctx: StageContext, name: str, changed: bool, status: int | None) -> None:
    """Say an adaptive limit's new concurrency (this process's), when it changed."""
    if changed:
        capacity = ctx._run.limits.caps[name].capacity
        why = f"after a {status}" if status else "after a round of calls that succeeded"
        detail = f"{name}: {capacity} at once {why}"
        ctx.say("limit_adapted", detail, value=float(capacity), attrs={"limit": name})


def _base_url(provider: Provider) -> str | None:
    url = getattr(provider, "base_url", None)
    return url if isinstance(url, str) and url else None


class _Slot:
    """One limit's slot for one call: the wait said and not charged, the hold renewed only
    while the job makes progress, the give-back said."""

    def __init__(
        self,
        ctx: StageContext,
        store: SlotStore,
        limit: CallLimit,
        *,
        window: str | None = None,
        weight: int | None = None,
    ) -> None:
        self.ctx, self.limit, self.rate, self.weight = ctx, limit, window, weight
        timings = ctx._run.keeper.timings
        fence = ctx.fence
        alert = ctx._run.keeper.policy is StallPolicy.ALERT
        owner = f"{fence.owner_id}/{secrets.token_hex(6)}"  # one per call: never shared by two
        priority = ctx.job.priority  # its turn among the waiters: higher first
        self.grant: SlotGrant | None = None  # a window's place, once taken
        if window is not None:  # a place in the rpm or tpm window: taken, never held
            name = limit.rate_name if window == "rpm" else limit.tokens_name
            capacity = limit.rpm if window == "rpm" else limit.tpm
            assert name is not None and capacity is not None
            self.window = f"{window} {capacity}, "
            self.hold = SlotHold(
                store,
                name,
                owner,
                capacity=capacity,
                ttl=RATE_WINDOW_S,
                max_wait=limit.max_wait,
                priority=priority,
                on_wait=self._waiting,
                weight=weight,
            )
        else:
            assert limit.concurrency is not None
            self.window = ""
            cap = ctx._run.limits.cap(limit)  # adaptive: this process's share for now
            self.hold = SlotHold(
                store,
                limit.name,
                owner,
                capacity=limit.concurrency if cap is None else cap.capacity,
                ttl=timings.ttl,
                max_wait=limit.max_wait,
                priority=priority,
                renew_every=timings.renew_interval,
                stuck=None if alert else self._stuck,
                on_wait=self._waiting,
            )
        self.ahead: int | None = None  # set once the call has had to wait
        self.paused = False  # the last ask found the limit paused
        self._around: tuple[str | None, StageBudget] | None = None
        self._paused: tuple[float, float | None] | None = None  # (when, hard deadline left)

    async def __aenter__(self) -> _Slot:
        try:
            if self.rate:
                self.grant = await self.hold.take()
            else:
                await self.hold.__aenter__()
        finally:
            self._resume()
        self.ctx.say(
            "slot_taken",
            f"a slot of {self.limit.name}" + (f" ({self.window[:-2]})" if self.window else ""),
            value=self.hold.waited,
            attrs={"limit": self.limit.name, **({"window": self.rate} if self.rate else {})},
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.rate:
            return  # the window's place lapses by itself
        try:
            await self.hold.__aexit__(*exc)  # type: ignore[arg-type]
        finally:
            self.ctx.say("slot_released", self.limit.name, attrs={"limit": self.limit.name})

    def _waiting(self, ahead: int) -> None:
        """After an ask that found no slot: the first one pauses the call's budgets."""
        ctx, name = self.ctx, self.limit.name
        first = self.ahead is None
        paused = self.hold.paused
        if ahead == self.ahead and bool(paused) == self.paused:
            return
        self.ahead, self.paused = ahead, bool(paused)
        why = f"paused {paused:.1f}s more by the provider, " if paused else ""
        text = f"waiting for a slot of {name} ({self.window}{why}{ahead} ahead)"
        ctx.say("slot_wait", text, value=float(ahead), attrs={"limit": name, "ahead": ahead})
        if first:
            self._pause()
            run = ctx._run
            note = getattr(run.store, "note", None)
            if note is not None:
                fence = ctx.fence
                task = asyncio.ensure_future(
                    note(fence.key, "slot_wait", text, owner_id=fence.owner_id, token=fence.token)
                )
                run.notes.adopt(task, fence.key)

    def _pause(self) -> None:
        """The wait is its own budget: a ``slot_wait`` step, the hard deadline paused."""
        ctx, run = self.ctx, self.ctx._run
        tracker, hard = ctx.tracker, run.hard
        self._around = (tracker.stage, tracker.budget)
        wait_budget = self.limit.max_wait + run.keeper.timings.ttl
        tracker.enter("slot_wait", StageBudget(wait_budget, tracker.budget.deadline))
        now = asyncio.get_running_loop().time()
        left = None if hard is None or hard.at is None else hard.at - now
        self._paused = (now, left)
        if hard is not None:
            hard.move(None)

    def _resume(self) -> None:
        """After the wait: the stage again (entering it is progress), its deadline resumed
        with what it had left, and the retry deadline moved by the time waited."""
        if self._paused is None or self._around is None:
            return
        ctx, run = self.ctx, self.ctx._run
        (paused_at, left), (stage, budget) = self._paused, self._around
        self._paused = None
        loop_now = asyncio.get_running_loop().time()
        if stage is not None:
            ctx.tracker.enter(stage, budget)
        if run.hard is not None and left is not None:
            run.hard.move(loop_now + left)
        if run.deadline_at is not None:
            run.deadline_at += loop_now - paused_at

    def _stuck(self) -> tuple[str, float] | None:
        """Why the job holding this slot is stuck (no progress within its budget), or None."""
        tracker = self.ctx.tracker
        idle, budget = tracker.idle(), tracker.budget.max_no_progress
        if idle <= budget:
            return None
        why = f"no progress for {idle:.1f}s in {tracker.stage!r} (max_no_progress {budget:g}s)"
        return why, budget
