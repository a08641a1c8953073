"""A resumable (background) response across the ``call_ai`` stage's calls: resumed by a
retry, cancelled once given up, so a job pays for at most one response per attempt.

On OpenAI a background response keeps generating, and billing, whether or not anyone reads
it. So within one attempt:

* a call-level retry (:func:`~ai_lease.retry.call_with_retries`: a first-token timeout while
  the model thinks silently, a stream cut before any text) **resumes** the response the
  failed call left — its checkpoint exists from ``response.created`` on — instead of
  creating another (:func:`retry_point`);
* a response the stage **gives up** (the retries ran out, a resume that failed and is
  replaced by a fresh call) is **cancelled** (:func:`cancel_left`): best effort, bounded by
  :data:`CANCEL_WAIT_S` and by the stage's deadline, said as a ``response_abandoned`` event
  (its detail: what came of the cancel; a warning in the log when it did not work) and noted
  in the job's timeline (a ``model_call`` entry starting ``cancel``).

A cancellation of the stage (a lost lease, a stall, the stage's deadline) cancels nothing:
the keeper has stored the checkpoint, and whoever runs the job next resumes that response.
Nor is anything cancelled while the lease may have lapsed (a new owner may be resuming it).

>>> CANCEL_WAIT_S
5.0
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from ai_lease.errors import LeaseLost
from ai_lease.providers.base import Checkpoint, Provider
from ai_lease.run.call_notes import note_call

if TYPE_CHECKING:
    from ai_lease.run.context import StageContext

__all__ = ["CANCEL_WAIT_S", "cancel_left", "cancelling_abandoned", "retry_point"]

CANCEL_WAIT_S = 5.0
"""The longest a cancel of a given-up response is waited for (then it is given up on)."""
_DEADLINE_MARGIN_S = 0.1  # a cancel that would end this near the stage's deadline is not sent

log = logging.getLogger("ai_lease.runner")
T = TypeVar("T")


def retry_point(ctx: StageContext, provider: Provider) -> Checkpoint | None:
    """Where a retried call picks its stream up: the checkpoint the failed call left (this
    provider's), with the text collected so far — the guard's, or, when the guard has none
    yet, the text that call was itself resumed with; None: call afresh."""
    point, guard = ctx._run.checkpoint, ctx._run.guard
    if point is None or point.provider != provider.name:
        return None
    text = "".join(guard.text_parts) if guard is not None else ""
    return replace(point, text=text or point.text)


async def cancelling_abandoned(ctx: StageContext, provider: Provider, calls: Awaitable[T]) -> T:
    """Await ``calls`` (the stage's calls, retries included); when they fail (an exception,
    not a cancellation), the response they leave is cancelled before the error goes on."""
    try:
        return await calls
    except Exception as exc:
        if ctx._run.checkpoint is not None:
            await cancel_left(ctx, provider, ctx._run.checkpoint, exc)
        raise


async def cancel_left(
    ctx: StageContext, provider: Provider, point: Checkpoint, error: BaseException
) -> None:
    """Cancel the response ``point`` names, given up after ``error`` (module docstring):
    only ``provider``'s, on a lease still held, bounded; what came of it is said and noted."""
    cancel = getattr(provider, "cancel_response", None)
    if cancel is None or point.provider != provider.name:
        return
    try:
        ctx.ensure_lease()
    except LeaseLost:  # a new owner may be resuming it: leave it be
        log.info(
            "job %r: response %s left running: the lease may have lapsed",
            ctx.job.key,
            point.response_id,
        )
        return
    wait_s = _wait_s(ctx)
    if wait_s > 0:
        outcome = await _bounded(cancel, point.response_id, wait_s)
    else:
        outcome = "not sent: the stage's deadline is too near"
    why = type(error).__name__
    if not outcome.startswith("cancelled"):
        log.warning(
            "job %r: response %s may still be running (and billed): %s; cancel it by hand "
            "(POST /responses/{id}/cancel)",
            ctx.job.key,
            point.response_id,
            outcome,
        )
    ctx.say(
        "response_abandoned",
        f"{point.response_id}: {outcome}",
        attrs={"provider": provider.name, "response_id": point.response_id, "after": why},
    )
    detail = f"cancel · {provider.name} · response {point.response_id} · after {why} · {outcome}"
    await note_call(ctx._run.store, ctx.fence, ctx.tracker.stage, detail, ctx._run.notes)


def _wait_s(ctx: StageContext) -> float:
    """How long a cancel may take: :data:`CANCEL_WAIT_S`, less near the stage's deadline."""
    if ctx._run.deadline_at is None:
        return CANCEL_WAIT_S
    left = ctx._run.deadline_at - ctx.tracker.clock() - _DEADLINE_MARGIN_S
    return min(CANCEL_WAIT_S, left)


async def _bounded(cancel: Callable[[str], Awaitable[str]], response_id: str, wait_s: float) -> str:
    """The cancel's outcome, or why there is none within ``wait_s``."""
    try:
        async with asyncio.timeout(wait_s):
            return str(await cancel(response_id))
    except TimeoutError:
        return f"not cancelled: no answer within {wait_s:.1f} s"
