"""The ``[worker]`` section of the settings: how ``ai-lease worker`` runs each job.

>>> WorkerSettings().isolation
'task'

``isolation`` (``AI_LEASE_WORKER__ISOLATION``): ``task`` runs a job as a task of the
worker's event loop; ``process`` runs its stages up to ``parse`` in a warm child process,
which the worker stops by SIGTERM, ``terminate_grace`` seconds, then SIGKILL when it
stalls, is cancelled or loses its lease (ai_lease/run/isolation/parent.py). The command's
``--isolation`` and ``--terminate-grace`` flags override these.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ai_lease.settings_provider import _Section

__all__ = ["MAX_TERMINATE_GRACE_S", "WorkerSettings"]

MAX_TERMINATE_GRACE_S = 300.0
"""The longest SIGTERM window (the worker's own bound: ``isolation.MAX_TERMINATE_GRACE``)."""


class WorkerSettings(_Section):
    """A worker's isolation of its jobs and the SIGTERM window it gives a child."""

    isolation: Literal["task", "process"] = "task"
    terminate_grace: Annotated[
        float, Field(ge=0, le=MAX_TERMINATE_GRACE_S, allow_inf_nan=False)
    ] = 10.0
