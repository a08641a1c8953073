"""The same request made straight to a server with httpx (and httpx-sse for streams): the
reference an answer through ai_lease is compared with, and a way to see what a server sends."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import connect_sse

import ai_lease
from tests.realservers.servers import MODEL

__all__ = ["ask", "ask_stream", "chat_body", "run_job"]


def chat_body(prompt: str, **fields: Any) -> dict[str, Any]:
    """An OpenAI chat body for ``prompt`` as the only user message (as ai_lease sends a job
    whose ``prompt_text`` is ``{{ input }}``)."""
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], **fields}


def _headers() -> dict[str, str]:
    return {"X-Request-Id": str(uuid.uuid4())}


def ask(url: str, body: Mapping[str, Any], *, timeout: float = 60.0) -> dict[str, Any]:
    """POST ``body`` (not streamed) to ``url``; the decoded answer (raises on non-2xx)."""
    reply = httpx.post(url, json={**body, "stream": False}, headers=_headers(), timeout=timeout)
    reply.raise_for_status()
    answer: dict[str, Any] = reply.json()
    return answer


def ask_stream(url: str, body: Mapping[str, Any], *, timeout: float = 60.0) -> list[Any]:
    """POST ``body`` streamed to ``url``; every event's data (JSON decoded; ``[DONE]`` kept
    as the string)."""
    events: list[Any] = []
    with (
        httpx.Client(timeout=timeout) as client,
        connect_sse(
            client, "POST", url, json={**body, "stream": True}, headers=_headers()
        ) as source,
    ):
        source.response.raise_for_status()
        for event in source.iter_sse():
            events.append(event.data if event.data == "[DONE]" else json.loads(event.data))
    return events


def stream_text(events: list[Any]) -> str:
    """The content of an OpenAI chat stream's events, joined."""
    return "".join(
        choice["delta"].get("content") or ""
        for event in events
        if isinstance(event, dict)
        for choice in event.get("choices", [])
    )


async def run_job(
    store: Path,
    base_url: str,
    path: tuple[str, Mapping[str, Any]],
    job: ai_lease.Job,
    **connect: Any,
) -> ai_lease.JobState:
    """Run ``job`` through ``ai_lease.connect`` on the provider ``path`` names (name,
    options) at ``base_url``, with a SQLite store at ``store``; its DONE record."""
    name, options = path
    async with ai_lease.connect(
        f"sqlite:///{store}",
        provider=name,
        provider_options={"base_url": base_url, **options},
        **connect,
    ) as client:
        return await client.run(job)
