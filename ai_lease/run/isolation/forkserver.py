"""Preloaded into process isolation's fork server (and imported nowhere else): the server
dies with the worker that started it, so its children do too.

A fork server outlives a SIGKILL-ed worker while any child it forked is alive (each child
holds the server's "alive" pipe), and a child stuck in its stage would run on, orphaned,
for ever. On Linux the server asks the kernel for ``SIGKILL`` when its parent (the worker)
dies, and every child it forks asks the same of the server (``child_main``), so a worker's
death takes its whole tree with it. Importing this module anywhere else would tie that
process's life to its parent's: only :class:`~ai_lease.run.isolation.pool.ChildPool` names
it, as the server's preload.
"""

from __future__ import annotations

from ai_lease.run.isolation.child import die_with_parent

die_with_parent()
