"""What the dashboard shows is exactly what is stored: a model's answer byte for byte (words
that look like secrets included), while a configured secret is masked in every encoding an
error body carries it in — in the stored last_error and on the page."""

from __future__ import annotations

import base64
import html
import re

import httpx
import pytest

from ai_lease.errors import JobFailed, ProviderError
from ai_lease.job import Job, Status
from ai_lease.lease import LeaseStore
from ai_lease.redaction import redact, register_secret
from ai_lease.testing.scripted import Raise, ScriptedProvider
from tests.test_ui_app import runner, serving

ANSWER = (
    '  password: hunter2 and {"api_key": null, "n": {"deep": [1, {}]}} '
    "sk-notakey-but-words, Bearer of news; secret=plain\n\ttrailing space "
)
SECRET = "zq-9f2c41d7e6b8a03154-canary"


def _pre(page: str, element: str) -> str:
    match = re.search(rf'<pre id="{element}">(.*?)</pre>', page, re.S)
    assert match is not None, page[:500]
    return html.unescape(match.group(1))


async def test_a_result_is_shown_byte_for_byte(store: LeaseStore) -> None:
    """An answer holding `password: hunter2`, `"api_key": null`, nested braces, leading and
    trailing whitespace is stored and shown exactly (HTML-escaped, not redacted)."""
    await runner(store, ScriptedProvider([ANSWER[:40], ANSWER[40:]])).run(Job("exact", input="x"))
    job = await store.get("exact")
    assert job is not None and job.status is Status.DONE
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        page = (await client.get("/jobs/exact")).text
    assert _pre(page, "result") == ANSWER


def _forms(secret: str) -> dict[str, str]:
    raw = secret.encode()
    return {
        "upper": secret.upper(),
        "base64": base64.b64encode(raw).decode(),
        "base64 in a header": base64.b64encode(b"user:" + raw).decode(),
        "urlsafe base64": base64.urlsafe_b64encode(b"x" + raw).decode(),
        "\\u-escaped": "".join(f"\\u{ord(c):04x}" for c in secret),
        "%XX": "".join(f"%{b:02x}" for b in raw),
        "first half": secret[: len(secret) // 2],
        "second half": secret[len(secret) // 2 :],
    }


def _leaks(text: str, secret: str) -> list[str]:
    """The encodings whose telltale part (the secret's own bits) survive in ``text``."""
    found = []
    for name, form in _forms(secret).items():
        core = form[4:-4] if name.startswith(("base64", "urlsafe")) else form
        if core.lower() in text.lower():
            found.append(name)
    return found


def test_the_redactor_masks_every_encoding_of_a_registered_secret() -> None:
    """Upper-cased, base64 (alone, inside a longer value, URL-safe), \\u-escaped, %XX and
    either half of a registered secret are masked; ordinary words around them stay."""
    register_secret(SECRET)
    for name, form in _forms(SECRET).items():
        text = redact(f"401 from upstream: echo {form} end")
        assert not _leaks(text, SECRET), (name, text)
        assert text.startswith("401 from upstream: echo ") and text.endswith(" end"), name


async def test_a_secret_in_an_error_body_never_reaches_the_record_or_page(
    store: LeaseStore,
) -> None:
    """A provider error echoing the configured key in every encoding: the stored last_error
    and the job page carry none of them."""
    register_secret(SECRET)
    body = " | ".join(f"{name}={form}" for name, form in _forms(SECRET).items())
    error = ProviderError(f"HTTP 401: {body}", retryable=False, status=401)
    with pytest.raises(JobFailed):
        await runner(store, ScriptedProvider([Raise(error)])).run(Job("leaky", input="x"))
    job = await store.get("leaky")
    assert job is not None and job.status is Status.FAILED and job.last_error
    assert "HTTP 401" in job.last_error
    assert not _leaks(job.last_error, SECRET), job.last_error
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        page = html.unescape((await client.get("/jobs/leaky")).text)
    assert not _leaks(page, SECRET)
