"""Job files: a job described in TOML or JSON, checked field by field.

.. code-block:: toml

    key = "summary-2026-11-29"          # the job's idempotency key
    prompt = "summarize"                # prompts/summarize.j2
    input_file = "article.txt"          # beside the job file; or: input = "text…"
    [variables]
    sentences = 3
    [provider]                          # optional: overrides the settings' provider
    name = "openai-compatible"
    model = "qwen2.5:7b"
    base_url = "http://127.0.0.1:11434/v1"
    headers = { "X-Team" = "research" } # extra HTTP headers (never a key)

The ``[provider]`` table (``name``, ``model``, ``base_url``, ``background``, ``headers``;
``temperature`` and ``max_tokens`` move to the job itself) is stored with the job as its
:class:`~ai_lease.job_provider.ProviderChoice`: a worker that runs it (``submit --detach``,
or a ``submit`` interrupted and left to workers) runs it on that provider, with the key its
own settings hold for it, or fails it at once saying why. A key never goes in a job file.

A job may also give ``tools`` (OpenAI function tools), ``tool_choice``, ``response_format``
(``json_object`` or ``json_schema``) and ``images`` (http(s) or ``data:`` URLs, sent as image
parts of the user message); :mod:`ai_lease.job_shapes` says their bounds. ``priority``
(-100..100) is the job's turn for a provider slot under ``[limits]``: higher first.

Every problem is a :class:`JobSpecError` naming the file, and the line and column for a
syntax error, or the field for a bad value. A relative ``input_file`` is read relative to
the job file's folder (a ``--input-file`` flag, relative to the working directory). Job
files are bounded: at most 32 MiB, nested at most 32 levels, integers within 64 bits.
"""

from __future__ import annotations

import json
import math
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ai_lease.errors import InputError, JobSpecError
from ai_lease.job import Job

__all__ = ["JobFile", "load_job_file"]

_PROVIDER_KEYS = {
    "name",
    "model",
    "base_url",
    "temperature",
    "max_tokens",
    "background",
    "headers",
}
_MAX_FILE_BYTES = 32 * 2**20
_MAX_DEPTH = 32
_INT_RANGE = range(-(2**63), 2**63)
_JOB_FIELDS = {f.name: f for f in fields(Job)}


@dataclass(frozen=True)
class JobFile:
    """A parsed job file: the job, and the provider settings it asks for (if any)."""

    job: Job
    provider: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None


def _read(path: Path) -> dict[str, Any]:
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise JobSpecError(f"job file {str(path)!r}: not a regular file")
        if info.st_size > _MAX_FILE_BYTES:
            raise JobSpecError(
                f"job file {str(path)!r}: over {_MAX_FILE_BYTES} bytes "
                "(keep large inputs in an input_file)"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobSpecError(f"job file {str(path)!r}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise JobSpecError(f"job file {str(path)!r}: not UTF-8 (byte {exc.start})") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except json.JSONDecodeError as exc:
        raise JobSpecError(
            f"job file {str(path)!r}, line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise JobSpecError(f"job file {str(path)!r}: {exc}") from None
    except RecursionError:
        raise JobSpecError(
            f"job file {str(path)!r}: nested deeper than {_MAX_DEPTH} levels"
        ) from None
    if not isinstance(data, dict):
        raise JobSpecError(f"job file {str(path)!r}: expected a table/object at the top level")
    _check_bounds(f"job file {str(path)!r}", data, "", 0)
    return data


def _check_bounds(where: str, value: Any, at: str, depth: int) -> None:
    """Refuse what no job needs and no store can hold: deep nesting, integers past 64
    bits, non-finite floats."""
    if depth > _MAX_DEPTH:
        raise JobSpecError(f"{where}: {at!r} is nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_bounds(where, item, f"{at}.{key}" if at else str(key), depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_bounds(where, item, f"{at}[{index}]", depth + 1)
    elif isinstance(value, int) and not isinstance(value, bool) and value not in _INT_RANGE:
        raise JobSpecError(f"{where}: {at!r} is an integer beyond 64 bits")
    elif isinstance(value, float) and not math.isfinite(value):
        raise JobSpecError(f"{where}: {at!r} must be a finite number, got {value}")


def _check_types(where: str, data: Mapping[str, Any]) -> None:
    expect: dict[str, tuple[type, ...]] = {
        "key": (str,),
        "input_file": (str,),
        "prompt": (str,),
        "prompt_text": (str,),
        "system": (str,),
        "model": (str,),
        "output": (str,),
        "stream": (bool,),
        "allow_empty": (bool,),
        "variables": (dict,),
        "temperature": (int, float),
        "max_tokens": (int,),
        "priority": (int,),
        "tools": (list,),
        "tool_choice": (str, dict),
        "response_format": (dict,),
        "images": (list,),
    }
    for name, value in data.items():
        kinds = expect.get(name)
        if kinds is None:
            continue
        if not isinstance(value, kinds) or isinstance(value, bool) != (bool in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise JobSpecError(f"{where}: field {name!r} must be {names}, got {value!r:.60}")


def _check_provider(where: str, provider: Mapping[str, Any]) -> None:
    """``[provider]`` values of the right types: strings, a boolean ``background`` and a
    ``headers`` table of strings (:class:`~ai_lease.job_provider.ProviderChoice` bounds them)."""
    for name, value in provider.items():
        if name not in ("background", "headers") and not isinstance(value, str):
            raise JobSpecError(f"{where}: provider.{name} must be a string, got {value!r:.60}")
    if not isinstance(provider.get("background", False), bool):
        raise JobSpecError(f"{where}: provider.background must be true or false")
    headers = provider.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise JobSpecError(
            f'{where}: provider.headers must be a table of name = "value" strings, '
            f"got {headers!r:.60}"
        )


def build_job_file(
    data: Mapping[str, Any], where: str, overrides: Mapping[str, Any] | None = None
) -> JobFile:
    """Check ``data`` (a parsed job file) and apply ``overrides`` (non-None values win)."""
    data = dict(data)
    provider = data.pop("provider", {})
    if not isinstance(provider, dict):
        raise JobSpecError(f"{where}: [provider] must be a table")
    unknown = sorted(set(data) - set(_JOB_FIELDS)) + [
        f"provider.{k}" for k in sorted(set(provider) - _PROVIDER_KEYS)
    ]
    if unknown:
        known = ", ".join(sorted(set(_JOB_FIELDS) - {"provider"}))
        raise JobSpecError(
            f"{where}: unknown field {unknown[0]!r} (job fields: {known}, [provider])"
        )
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        if name in ("provider", "provider_model"):
            provider["name" if name == "provider" else "model"] = value
            continue
        if name in ("input", "input_file"):  # one source of input replaces the other
            data.pop("input_file" if name == "input" else "input", None)
        data[name] = value
    for name in ("temperature", "max_tokens"):  # sampling is the job's: it travels in its spec
        if name in provider:
            if name in data:
                raise JobSpecError(
                    f"{where}: {name!r} is given both at the top level and in [provider]; keep one"
                )
            data[name] = provider.pop(name)
    _check_provider(where, provider)
    if "key" not in data:
        raise JobSpecError(f"{where}: the job has no 'key' (give one in the file or with --key)")
    _check_types(where, data)
    if provider:  # the choice travels in the job's spec: a worker runs it on that provider
        data["provider"] = provider
    try:
        job = Job(**data)
    except InputError as exc:
        raise JobSpecError(f"{where}: {exc}") from None
    return JobFile(job, provider)


def load_job_file(path: str | Path, overrides: Mapping[str, Any] | None = None) -> JobFile:
    """Read and check a TOML (or ``.json``) job file."""
    path = Path(path)
    data = _read(path)
    relative = data.get("input_file")
    if isinstance(relative, str) and not Path(relative).is_absolute():
        data["input_file"] = str(path.parent / relative)  # beside the job file, not the CWD
    built = build_job_file(data, f"job file {str(path)!r}", overrides)
    return JobFile(built.job, built.provider, path)
