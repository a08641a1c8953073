"""Process isolation for workers: each job's stages up to ``parse`` run in a warm child, which
the worker stops by the termination ladder when the job stalls, is cancelled or loses its
lease (``Worker(..., isolation="process")``).

The names a worker and its caller need are here; the rest lives in the modules beside:

* :mod:`~ai_lease.run.isolation.parent` — the worker's side: the pool around the runner's
  pipeline, the watch over each child, what crosses and what stays;
* :mod:`~ai_lease.run.isolation.child` — the child's side: the warm process that runs the
  stages, and the picklable :class:`ProviderFactory`;
* :mod:`~ai_lease.run.isolation.pool` — the warm children, started once, replaced when
  stopped; :mod:`~ai_lease.run.isolation.forkserver` — what the fork server preloads;
* :mod:`~ai_lease.run.isolation.env` — the environment a child gets (an allow-list);
* :mod:`~ai_lease.run.isolation.ladder` — SIGTERM → grace → SIGKILL → reap → audit, with
  :mod:`~ai_lease.run.isolation.evidence` (a stuck child's stacks and figures) and
  :mod:`~ai_lease.run.isolation.ladder_notes` (its steps in the job's timeline).
"""

from ai_lease.run.isolation.child import ProviderFactory
from ai_lease.run.isolation.parent import (
    MAX_TERMINATE_GRACE,
    ChildPool,
    check_isolation,
    isolated,
)

__all__ = ["MAX_TERMINATE_GRACE", "ChildPool", "ProviderFactory", "check_isolation", "isolated"]
