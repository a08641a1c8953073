"""The environment a process-isolation child gets: an allow-list, not the worker's whole one.

A child runs the job's stages and its provider; it needs what they need — the provider's
settings (``AI_LEASE_PROVIDER__*``, ``AI_LEASE_PROVIDERS__*``, the built-in providers'
ambient keys such as ``OPENAI_API_KEY``), the store's (``AI_LEASE_STORE__*``) and the
process basics (``PATH``, ``HOME``, locale, ``PYTHON*``, TLS certificate paths, proxies) —
and nothing else of the worker's: not a cloud credential (``AWS_SECRET_ACCESS_KEY``), not
the dashboard's token (``AI_LEASE_UI__TOKEN``). Anything more a plug-in needs is named with
``keep`` (:attr:`~ai_lease.run.isolation.child.ChildSpec.env_keep`).

The fork server the children come from is started with the allowed environment (so even
``/proc/<child>/environ``, the block the process was started with, holds nothing else),
and each child trims ``os.environ`` to the same list when it starts.

>>> sorted(allowed({"PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "x", "LC_ALL": "C"}))
['LC_ALL', 'PATH']
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Iterable, Iterator, Mapping

from ai_lease.providers import BUILTINS

__all__ = ["allowed", "only_allowed", "trim_environ"]

BASICS = frozenset(
    {
        *("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "PWD"),
        *("TMPDIR", "TEMP", "TMP", "VIRTUAL_ENV", "SYSTEMROOT", "COMSPEC"),
        *("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"),
        *("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"),
        *("http_proxy", "https_proxy", "all_proxy", "no_proxy"),
        "AI_LEASE_CONFIG",
    }
)
PREFIXES = ("LC_", "PYTHON", "AI_LEASE_PROVIDER__", "AI_LEASE_PROVIDERS__", "AI_LEASE_STORE__")
PROVIDER_NAMES = frozenset(
    name for builtin in BUILTINS.values() for name in (*builtin.key_env, *builtin.host_env)
)


def _kept(name: str, keep: Iterable[str]) -> bool:
    if name in BASICS or name in PROVIDER_NAMES or name.startswith(PREFIXES):
        return True
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in keep)


def allowed(environ: Mapping[str, str], keep: Iterable[str] = ()) -> dict[str, str]:
    """The part of ``environ`` a child may see (``keep``: more names, ``*`` globs allowed)."""
    keep = tuple(keep)
    return {name: value for name, value in environ.items() if _kept(name, keep)}


def trim_environ(keep: Iterable[str] = ()) -> None:
    """Drop from ``os.environ`` every name a child may not see (in the child)."""
    keep = tuple(keep)
    for name in [name for name in os.environ if not _kept(name, keep)]:
        del os.environ[name]


@contextlib.contextmanager
def only_allowed(keep: Iterable[str] = ()) -> Iterator[None]:
    """``os.environ`` trimmed to the allow-list while a process is started from here (the
    fork server, or a spawned child), then restored."""
    saved = dict(os.environ)
    try:
        trim_environ(keep)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
