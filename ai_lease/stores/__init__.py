"""The stores that keep leases, one package each, opened from a URL with :func:`open_store`:
:mod:`~ai_lease.stores.sqlite` (the embedded default), :mod:`~ai_lease.stores.redis` and
:mod:`~ai_lease.stores.postgres`. Each implements the protocols of :mod:`ai_lease.lease`."""

from ai_lease.stores.urls import SCHEMES, open_store

__all__ = ["SCHEMES", "open_store"]
