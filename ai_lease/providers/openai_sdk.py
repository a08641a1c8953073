"""``openai``: the official OpenAI SDK, for OpenAI and any OpenAI-compatible ``base_url``.

The SDK's own retries are off (``max_retries=0``): retry policy lives in one place, ai_lease's.
Measured traps of the SDK (3.x, on httpx2) that this adapter closes:

* it ends **without an error** on a stream cut before ``[DONE]`` and on a 200 with an HTML
  body — here a stream with no finish reason is a :class:`ProviderError`;
* its read timeout is reset by every SSE ``: ping`` comment, so a server that only pings
  never times out — the stream guard's first-token and idle timers do not see pings at all;
* its SSE decoder hands over an event with no ``data:`` (``retry: 3000`` alone), which the
  SDK then fails to decode as JSON — here such an event is not dispatched, as the SSE spec
  says; and it grows a line without bound — here one event may hold ``max_event_bytes``.

A stream that ends (``[DONE]`` or the body's end) without a finish reason is
:class:`StreamInterrupted`; a 200 event stream with no events at all is
:class:`EmptyEventStream`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
from openai._streaming import ServerSentEvent, SSEDecoder
from pydantic import SecretStr

from ai_lease.errors import (
    ConfigError,
    EmptyEventStream,
    ProviderError,
    StreamInterrupted,
    StreamLimitExceeded,
)
from ai_lease.providers.base import ChatRequest, Completion, Delta, Usage
from ai_lease.providers.errors import parse_retry_after
from ai_lease.providers.openai_compat import check_base_url, request_body, sampling_defaults
from ai_lease.resource import AsyncResource
from ai_lease.timeouts import StreamLimits

__all__ = ["OpenAISDKProvider"]

_TRANSPORT_MODULES = ("httpx", "httpx2", "httpcore", "httpcore2", "h11", "anyio")


class _EventTooLarge(Exception):
    pass


class _Decoder(SSEDecoder):
    """The SDK's SSE decoder, per the spec where it is not, and bounded: an event without
    data is not dispatched, and no line or event grows past ``max_event_bytes``. Counts the
    events it dispatched and whether ``[DONE]`` was one."""

    def __init__(self, max_event_bytes: int) -> None:
        super().__init__()
        self.max_event_bytes, self.size, self.events, self.done = max_event_bytes, 0, 0, False

    def decode(self, line: str) -> ServerSentEvent | None:
        if not line:
            self.size = 0
        else:
            self.size += len(line)
            if self.size > self.max_event_bytes:
                raise _EventTooLarge
        sse = super().decode(line)
        if sse is None or not sse.data:
            return None  # the spec: an event whose data buffer is empty is not dispatched
        self.events += 1
        self.done = self.done or sse.data.startswith("[DONE]")
        return sse

    async def aiter_bytes(self, iterator: AsyncIterator[bytes]) -> AsyncIterator[ServerSentEvent]:
        async for sse in super().aiter_bytes(self._bounded(iterator)):
            yield sse

    async def _bounded(self, iterator: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The bytes, refused once one line (not yet seen by ``decode``) grows too long."""
        run = 0
        async for chunk in iterator:
            end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
            run = len(chunk) - end - 1 if end >= 0 else run + len(chunk)
            if run > self.max_event_bytes:
                raise _EventTooLarge
            yield chunk


class _Client(openai.AsyncOpenAI):
    max_event_bytes = StreamLimits.max_event_bytes

    def _make_sse_decoder(self) -> _Decoder:
        return _Decoder(self.max_event_bytes)


class OpenAISDKProvider(AsyncResource):
    """Chat completions through ``openai.AsyncOpenAI``.

    >>> provider = OpenAISDKProvider(model="gpt-4o-mini", api_key="sk-…")  # doctest: +SKIP
    """

    name = "openai"

    def __init__(
        self,
        *,
        api_key: str | SecretStr | None = None,
        base_url: str | None = None,
        model: str | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 600.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        max_event_bytes: int = StreamLimits.max_event_bytes,
    ) -> None:
        if base_url is not None:
            check_base_url(base_url)
        self.defaults = sampling_defaults(temperature, max_tokens)
        key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        if key is None and base_url is None:
            raise ConfigError(
                "provider.api_key: OpenAI needs an API key "
                "(set AI_LEASE_PROVIDER__API_KEY or OPENAI_API_KEY)"
            )
        self.model = model
        self._openai = openai
        self._client = _Client(
            api_key=key or "not-needed",
            base_url=base_url,
            max_retries=0,
            timeout=openai.Timeout(read_timeout, connect=connect_timeout),
        )
        self._client.max_event_bytes = StreamLimits(max_event_bytes=max_event_bytes).max_event_bytes

    def __repr__(self) -> str:
        return f"OpenAISDKProvider(base_url={str(self._client.base_url)!r}, model={self.model!r})"

    def _translate(self, exc: Exception, chunks: int) -> ProviderError:
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            retryable = status >= 500 or status in (408, 409, 425, 429)
            retry_after = parse_retry_after(exc.response.headers.get("retry-after"))
            return ProviderError(
                f"HTTP {status}: {exc.message}",
                retryable=retryable,
                provider=self.name,
                status=status,
                retry_after=retry_after,
                partial=chunks > 0,
            )
        return ProviderError(
            f"{type(exc).__name__}: {exc}", retryable=True, provider=self.name, partial=chunks > 0
        )

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        body = request_body(request, self.model, stream=True, defaults=self.defaults)
        chunks, finished = 0, False
        stream: Any = None
        try:
            stream = await self._client.chat.completions.create(**body)
            try:
                async for chunk in stream:
                    for delta in self._deltas(chunk, chunks):
                        finished = finished or delta.finish_reason is not None
                        chunks += bool(delta.text)
                        yield delta
            finally:
                await stream.close()
        except self._openai.OpenAIError as exc:
            raise self._translate(exc, chunks) from exc
        except ProviderError:
            raise
        except _EventTooLarge:
            raise StreamLimitExceeded(
                "max_event_bytes", self._client.max_event_bytes, provider=self.name, chunks=chunks
            ) from None
        except ValueError as exc:  # the SDK's own JSON decoding of a malformed chunk
            raise self._malformed(exc, chunks) from exc
        except Exception as exc:  # httpx2 transport errors surface unwrapped mid-stream
            if type(exc).__module__.split(".")[0] not in _TRANSPORT_MODULES:
                raise
            raise self._translate(exc, chunks) from exc
        if not finished:
            raise self._unfinished(stream, chunks)

    def _unfinished(self, stream: Any, chunks: int) -> ProviderError:
        """Why a stream that ended without a finish reason is not an answer."""
        decoder = getattr(stream, "_decoder", None)
        kind = stream.response.headers.get("content-type", "") if stream is not None else ""
        if isinstance(decoder, _Decoder) and decoder.events == 0 and "text/event-stream" in kind:
            return EmptyEventStream(provider=self.name)
        if "text/event-stream" not in kind:
            return ProviderError(
                f"expected text/event-stream, got {kind or 'no content type'}",
                retryable=True,
                provider=self.name,
            )
        if isinstance(decoder, _Decoder) and decoder.done:
            return StreamInterrupted("[DONE] came", provider=self.name, chunks=chunks)
        return ProviderError(  # cut: as the lean adapter says it
            "the stream ended before [DONE]",
            retryable=True,
            provider=self.name,
            partial=chunks > 0,
        )

    def _deltas(self, chunk: Any, chunks: int) -> list[Delta]:
        """The deltas of one SDK chunk object; the SDK does not validate chunks, so a
        chunk of the wrong shape is a malformed-chunk error here."""
        try:
            out = []
            for choice in chunk.choices[:1]:
                text = (choice.delta.content if choice.delta else None) or ""
                if not isinstance(text, str):
                    raise TypeError(f"content is {type(text).__name__}, not text")
                if choice.finish_reason == "content_filter":
                    raise ProviderError(
                        "the answer was stopped by the content filter",
                        retryable=False,
                        provider=self.name,
                    )
                if text or choice.finish_reason:
                    out.append(Delta(text, choice.finish_reason))
            if chunk.usage is not None:
                usage = chunk.usage
                out.append(
                    Delta(
                        usage=Usage(
                            int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0)
                        )
                    )
                )
            return out
        except (AttributeError, TypeError, ValueError) as exc:
            raise self._malformed(exc, chunks) from exc

    def _malformed(self, exc: Exception, chunks: int) -> ProviderError:
        return ProviderError(
            f"malformed chunk: {type(exc).__name__}: {exc}"[:300],
            retryable=True,
            provider=self.name,
            partial=chunks > 0,
        )

    async def complete(self, request: ChatRequest) -> Completion:
        body = request_body(request, self.model, stream=False, defaults=self.defaults)
        try:
            answer: Any = await self._client.chat.completions.create(**body)
        except self._openai.OpenAIError as exc:
            raise self._translate(exc, 0) from exc
        choices = getattr(answer, "choices", None)
        if not choices:
            raise ProviderError(
                f"not a chat completion: {str(answer)[:80]!r}", retryable=True, provider=self.name
            )
        choice = choices[0]
        if choice.finish_reason == "content_filter":
            raise ProviderError(
                "the answer was stopped by the content filter", retryable=False, provider=self.name
            )
        usage = answer.usage
        return Completion(
            choice.message.content or "",
            choice.finish_reason,
            Usage(usage.prompt_tokens, usage.completion_tokens) if usage else None,
        )

    async def aclose(self) -> None:
        await self._client.close()
