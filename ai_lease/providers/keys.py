"""API keys: what a key may look like, and which hosts it may be sent to.

A key is bound to the base URL it was configured with (``provider.base_url``, else the
OpenAI API). A job file whose ``[provider] base_url`` names another host gets no key
unless ``provider.allowed_hosts`` lists that host: a job file cannot carry the user's key
off to a server of its choosing.

>>> check_key_destination("https://api.openai.com/v1", None, ())   # same host: allowed
>>> check_key_destination("http://elsewhere:8080/v1", None, ())
Traceback (most recent call last):
...
ai_lease.errors.ConfigError: provider.base_url 'http://elsewhere:8080/v1' ...
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from urllib.parse import urlsplit

from ai_lease.errors import ConfigError
from ai_lease.redaction import mask_url

__all__ = [
    "DEFAULT_BASE_URL",
    "MAX_KEY_CHARS",
    "check_api_key",
    "check_header_destination",
    "check_key_destination",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_KEY_CHARS = 4096
_DEFAULT_PORTS = {"http": 80, "https": 443}


def check_api_key(key: str) -> str:
    """``key`` if it is 1 to 4096 printable ASCII characters; else ValueError naming the
    problem (a code point and its position, or the length), never the key itself."""
    if len(key) > MAX_KEY_CHARS:
        raise ValueError(f"is {len(key)} characters long; at most {MAX_KEY_CHARS} are accepted")
    for position, char in enumerate(key):
        if not "\x21" <= char <= "\x7e":
            name = unicodedata.name(char, "a control character")
            raise ValueError(
                f"must be printable ASCII with no spaces: found U+{ord(char):04X} ({name}) "
                f"at position {position}; copy the key again"
            )
    if not key:
        raise ValueError("must not be empty")
    return key


def _host(url: str) -> tuple[str, str]:
    """(host, host:port) of ``url``, lower-cased, the port made explicit."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ConfigError(f"provider.base_url {mask_url(url)!r} is not a valid URL") from None
    host = (parts.hostname or "").lower()
    if not host or parts.scheme not in _DEFAULT_PORTS:
        raise ConfigError(
            f"provider.base_url {mask_url(url)!r} is not an http:// or https:// URL with a host"
        )
    return host, f"{host}:{port or _DEFAULT_PORTS[parts.scheme]}"


def check_key_destination(target: str, bound: str | None, allowed_hosts: Iterable[str]) -> None:
    """Raise :class:`ConfigError` unless a key bound to ``bound`` (None: the OpenAI API)
    may be sent to ``target``: the same scheme, host and port, or a host (``host`` or
    ``host:port``) in ``allowed_hosts``."""
    bound = bound or DEFAULT_BASE_URL
    if _may_go(target, bound, allowed_hosts):
        return
    host_port = _host(target)[1]
    raise ConfigError(
        f"provider.base_url {mask_url(target)!r} (from the job file) is another host than "
        f"the API key is configured for ({_host(bound)[1]}): the key is not sent there. "
        f"To allow it, add {host_port!r} to provider.allowed_hosts "
        f"(e.g. AI_LEASE_PROVIDER__ALLOWED_HOSTS={host_port}); or set provider.base_url in "
        "the configuration instead of the job file"
    )


def check_header_destination(
    target: str, trusted: str, allowed_hosts: Iterable[str], names: Iterable[str]
) -> None:
    """Raise :class:`ConfigError` unless headers ``names`` (they carry a credential) may go
    to ``target``: the host the settings configured, ``trusted``, or one in
    ``allowed_hosts`` (see :func:`check_key_destination`)."""
    if _may_go(target, trusted, allowed_hosts):
        return
    host_port = _host(target)[1]
    raise ConfigError(
        f"provider.headers: {', '.join(sorted(names))} carry a credential, and "
        f"provider.base_url {mask_url(target)!r} (from the job file) is another host than the "
        f"one configured ({_host(trusted)[1]}): they are not sent there. To allow it, add "
        f"{host_port!r} to provider.allowed_hosts; or drop those headers from the job file"
    )


def check_job_destination(
    target: str, trusted: Iterable[str | None], allowed_hosts: Iterable[str]
) -> None:
    """Raise :class:`ConfigError` unless a stored job's base URL ``target`` is one a worker's
    operator configured (any of ``trusted``) or allowed (``allowed_hosts``): whoever can
    submit a job must not make workers send requests to any host they choose."""
    host, host_port = _host(target)
    allowed = {h.strip().lower() for h in allowed_hosts}
    if host in allowed or host_port in allowed:
        return
    if any(url and _may_go(target, url, ()) for url in trusted):
        return
    raise ConfigError(
        f"the job's base_url {mask_url(target)!r} is not a host this worker is configured "
        f"for: add {host_port!r} to provider.allowed_hosts (e.g. "
        f"AI_LEASE_PROVIDER__ALLOWED_HOSTS={host_port}) on the workers, or set the base URL "
        "in their configuration"
    )


def _may_go(target: str, bound: str, allowed_hosts: Iterable[str]) -> bool:
    """Whether something bound to ``bound`` may be sent to ``target``."""
    host, host_port = _host(target)
    if urlsplit(target).scheme == urlsplit(bound).scheme and host_port == _host(bound)[1]:
        return True
    allowed = {h.strip().lower() for h in allowed_hosts}
    return host in allowed or host_port in allowed
