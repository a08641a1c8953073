"""The provider a job asks for: :class:`ProviderChoice`, stored with the job's spec.

A job file's ``[provider]`` table (or ``submit --provider`` / ``--model``) names the
provider that must answer the job, wherever it runs: on the submitting node, or on a
worker (``submit --detach``, or a foreground ``submit`` left to workers). The choice holds
the provider's ``name``, ``model``, ``base_url``, ``background`` and extra ``headers`` —
never a key: the node that runs the job takes the key for that provider from its own
settings, and only for a host that key may go to (:mod:`ai_lease.cli.provider_options`).

>>> ProviderChoice(name="anthropic", model="claude-sonnet-4-5").options()
{'name': 'anthropic', 'model': 'claude-sonnet-4-5'}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ai_lease.errors import JobSpecError
from ai_lease.redaction import is_credential

__all__ = ["MAX_HEADERS", "ProviderChoice"]

MAX_HEADERS = 32
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")  # an RFC 9110 token
_PRINTABLE = re.compile(r"^[^\x00-\x1f\x7f-\x9f]*$")  # no control characters
_HEADER_VALUE = re.compile(r"^[\x20-\x7e]*$")  # printable ASCII: every HTTP client sends it
_MAX_MODEL, _MAX_URL, _MAX_HEADER_VALUE = 256, 2048, 4096
# Headers the HTTP client frames the request with: a job setting one would break the request.
_FRAMING = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "content-type",
        "te",
        "upgrade",
        "keep-alive",
        "trailer",
        "expect",
        "proxy-connection",
    }
)
_FIELDS = ("name", "model", "base_url", "background", "headers")


@dataclass(frozen=True)
class ProviderChoice:
    """Which provider answers a job (each field None: the running node's settings decide).

    ``headers`` are extra HTTP headers for that provider's calls, kept as sorted
    ``(name, value)`` pairs so a choice is hashable (a worker caches one provider per
    distinct choice). Bounded: a name of at most 64 characters, a model of 256, a base URL
    of 2048 (http or https), at most 32 headers of 4096 characters each, none of them a
    credential header (``Authorization``, ``x-api-key`` …).
    """

    name: str | None = None
    model: str | None = None
    base_url: str | None = None
    background: bool | None = None
    headers: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if problem := _problem(self):
            raise JobSpecError(f"provider choice: {problem}")

    @classmethod
    def of(cls, value: ProviderChoice | Mapping[str, Any] | None) -> ProviderChoice | None:
        """``value`` as a choice (a mapping such as a job file's ``[provider]`` table, or a
        stored spec's); None or an empty mapping: no choice."""
        if value is None or isinstance(value, ProviderChoice):
            return value
        if not isinstance(value, Mapping):
            raise JobSpecError(f"provider choice: must be a table/object, got {value!r:.60}")
        unknown = sorted(set(value) - set(_FIELDS))
        if unknown:
            raise JobSpecError(
                f"provider choice: unknown field {unknown[0]!r} (known: {', '.join(_FIELDS)})"
            )
        if not value:
            return None
        data = dict(value)
        headers = data.pop("headers", None) or {}
        if not isinstance(headers, Mapping):
            raise JobSpecError(
                f"provider.headers: must be a table of name = value strings, got {headers!r:.60}"
            )
        if len(headers) > MAX_HEADERS:
            raise JobSpecError(f"provider choice: headers: at most {MAX_HEADERS} pairs")
        for name, value in headers.items():  # before sorting them: a mixed-type key would raise
            if not isinstance(name, str) or not isinstance(value, str):
                raise JobSpecError(
                    f"provider choice: headers: names and values must be strings ({name!r:.40})"
                )
        return cls(**data, headers=tuple(sorted(headers.items())))

    def options(self) -> dict[str, Any]:
        """The set fields, as ``provider_options`` overrides and as the stored spec holds
        them (``headers`` as a mapping)."""
        out: dict[str, Any] = {}
        for name in _FIELDS[:4]:
            if (value := getattr(self, name)) is not None:
                out[name] = value
        if self.headers:
            out["headers"] = dict(self.headers)
        return out

    def describe(self) -> str:
        """A short text for messages: ``'anthropic' (model 'm', base URL 'http://…')``."""
        parts = [f"model {self.model!r}"] if self.model else []
        if self.base_url:
            parts.append(f"base URL {self.base_url!r}")
        name = repr(self.name) if self.name else "the configured provider"
        return f"{name} ({', '.join(parts)})" if parts else name


def _problem(choice: ProviderChoice) -> str | None:
    """What is wrong with ``choice`` (None: nothing)."""
    name = choice.name
    if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
        return f"name: must be a provider name such as 'openai' (got {choice.name!r:.70})"
    for name, value, limit in (
        ("model", choice.model, _MAX_MODEL),
        ("base_url", choice.base_url, _MAX_URL),
    ):
        if value is not None and (
            not isinstance(value, str) or not 0 < len(value) <= limit or not _PRINTABLE.match(value)
        ):
            return f"{name}: must be 1 to {limit} printable characters (got {value!r:.70})"
    if choice.base_url is not None and (problem := _url_problem(choice.base_url)):
        return f"base_url: {problem}"
    if choice.background is not None and not isinstance(choice.background, bool):
        return f"background: must be true or false (got {choice.background!r:.40})"
    return _headers_problem(choice.headers)


def _url_problem(url: str) -> str | None:
    """An http(s) URL with a host, and no user, password or query: a job's spec is stored
    in plain text, so nothing in it may be a secret."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None or parts.query:
        return (
            "must carry no user, password or query (a job's spec is stored in plain text); "
            "give the key in the settings ([providers.<name>] api_key)"
        )
    return None


def _headers_problem(headers: Any) -> str | None:
    if not isinstance(headers, tuple) or len(headers) > MAX_HEADERS:
        return f"headers: at most {MAX_HEADERS} name = value pairs"
    for pair in headers:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            return "headers: must be name = value pairs"
        name, value = pair
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            return f"headers: {name!r:.70} is not a valid header name"
        if (
            not isinstance(value, str)
            or len(value) > _MAX_HEADER_VALUE
            or not _HEADER_VALUE.match(value)
        ):
            return (
                f"headers.{name}: must be printable ASCII of at most {_MAX_HEADER_VALUE} characters"
            )
        if name.lower() in _FRAMING:
            return f"headers.{name}: is set by the HTTP client itself, not by a job"
        if is_credential(name):
            return (
                f"headers.{name}: a credential header is not stored with a job (job specs are "
                "kept in plain text); give the key in the settings ([providers.<name>] api_key)"
            )
    return None
