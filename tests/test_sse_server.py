"""Tests of the scripted SSE server harness, driven by real HTTP clients on loopback."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import httpx_sse
import orjson
import pytest
from openai import AsyncOpenAI

from tests.harness.sse_server import (
    Cut,
    Hang,
    Reset,
    Sleep,
    SSEServer,
    chat_chunks,
    completion_json,
    drip,
    json_response,
    raw,
    sse,
)

CHAT_PATH = "/chat/completions"
CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


@pytest.fixture
async def client(server: SSEServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=5.0) as running:
        yield running


async def post_and_read(client: httpx.AsyncClient) -> tuple[httpx.Response, list[bytes]]:
    """POST the chat body and collect the raw body pieces as they arrive."""
    async with client.stream("POST", CHAT_PATH, json=CHAT_BODY) as response:
        return response, [piece async for piece in response.aiter_raw()]


async def test_events_arrive_in_order_with_sse_framing(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """Dict events become `data: <json>` blocks in order, then `[DONE]`, chunked."""
    server.enqueue(sse({"n": 1}, {"n": 2, "s": "é"}))
    response, pieces = await post_and_read(client)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in response.headers
    assert b"".join(pieces) == (
        b'data: {"n":1}\n\ndata: {"n":2,"s":"\xc3\xa9"}\n\ndata: [DONE]\n\n'
    )


async def test_httpx_sse_parses_the_stream(server: SSEServer, client: httpx.AsyncClient) -> None:
    """httpx_sse sees one event per dict, with the JSON intact, and the [DONE] sentinel."""
    server.enqueue(sse(*chat_chunks(["a", "b"])))
    async with httpx_sse.aconnect_sse(client, "POST", CHAT_PATH, json=CHAT_BODY) as source:
        data = [event.data async for event in source.aiter_sse()]
    assert data[-1] == "[DONE]"
    deltas = [orjson.loads(item)["choices"][0]["delta"] for item in data[:-1]]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "a"}, {"content": "b"}, {}]


async def test_done_false_ends_the_body_cleanly_without_the_sentinel(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """done=False leaves out `[DONE]` but still ends the HTTP body properly."""
    server.enqueue(sse({"n": 1}, done=False))
    _, pieces = await post_and_read(client)
    assert b"".join(pieces) == b'data: {"n":1}\n\n'


async def test_sleep_delays_the_next_event(server: SSEServer, client: httpx.AsyncClient) -> None:
    """A Sleep step holds back the next event for about that long."""
    server.enqueue(sse({"n": 0}, Sleep(0.25), {"n": 1}))
    arrivals: list[float] = []
    async with client.stream("POST", CHAT_PATH, json=CHAT_BODY) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())
    assert len(arrivals) == 2
    assert 0.2 <= arrivals[1] - arrivals[0] < 2.0


async def test_drip_sends_deltas_at_the_given_pace(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """drip() spreads the text over chunk_size deltas spaced `every` seconds apart."""
    server.enqueue(sse(*drip("hello", every=0.1, chunk_size=2)))
    started = time.monotonic()
    async with httpx_sse.aconnect_sse(client, "POST", CHAT_PATH, json=CHAT_BODY) as source:
        chunks = [orjson.loads(e.data) async for e in source.aiter_sse() if e.data != "[DONE]"]
    elapsed = time.monotonic() - started
    contents = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert contents == ["", "he", "ll", "o", None]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert 0.28 <= elapsed < 3.0  # real: a socket to the test SSE server


async def test_cut_ends_the_stream_with_a_protocol_error(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """Cut closes the connection mid-body: the client reads the events, then an incomplete body."""
    server.enqueue(sse({"n": 1}, Cut()))
    received: list[bytes] = []
    with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
        async with client.stream("POST", CHAT_PATH, json=CHAT_BODY) as response:
            async for piece in response.aiter_raw():
                received.append(piece)
    assert b"".join(received) == b'data: {"n":1}\n\n'
    await server.wait_connections_open(0)


async def test_close_framing_makes_a_cut_look_like_a_clean_end(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """With chunked=False the body ends at FIN, so a Cut reads as a complete body."""
    server.enqueue(sse({"n": 1}, chunked=False), sse({"n": 1}, Cut(), chunked=False))
    response, whole = await post_and_read(client)
    _, truncated = await post_and_read(client)
    assert response.headers["connection"] == "close"
    assert "transfer-encoding" not in response.headers
    assert b"".join(whole) == b'data: {"n":1}\n\ndata: [DONE]\n\n'
    assert b"".join(truncated) == b'data: {"n":1}\n\n'


async def test_reset_gives_a_connection_error(server: SSEServer, client: httpx.AsyncClient) -> None:
    """Reset aborts with a TCP RST, which the client sees as a read error."""
    server.enqueue(sse({"n": 1}, Sleep(0.05), Reset()))
    with pytest.raises(httpx.ReadError):
        async with client.stream("POST", CHAT_PATH, json=CHAT_BODY) as response:
            async for _ in response.aiter_raw():
                pass
    await server.wait_connections_open(0)


async def test_raw_byte_events_arrive_verbatim(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """Bytes events (pings, broken JSON, a line split in two) reach the client untouched."""
    events = [b": ping\n\n", b"data: {not json\n\n", b'data: {"n"', b":", b"1}\n\n"]
    server.enqueue(sse(*events, done=False))
    _, pieces = await post_and_read(client)
    assert b"".join(pieces) == b"".join(events)


async def test_json_response_has_status_headers_and_body(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """json_response sends its status, extra headers and a JSON body with a Content-Length."""
    body = {"error": {"message": "Rate limit reached", "type": "requests"}}
    server.enqueue(json_response(429, body, {"Retry-After": "1"}))
    response = await client.post(CHAT_PATH, json=CHAT_BODY)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.headers["content-type"] == "application/json"
    assert int(response.headers["content-length"]) == len(response.content)
    assert response.json() == body


async def test_json_response_delay_holds_back_the_headers(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """A delay passes before the status line is sent."""
    server.enqueue(json_response(200, completion_json("hi", (1, 1)), delay=0.25))
    started = time.monotonic()
    response = await client.post(CHAT_PATH, json={"stream": False})
    assert 0.2 <= time.monotonic() - started < 2.0  # real: a socket to the test SSE server
    assert response.json()["choices"][0]["message"]["content"] == "hi"


async def test_raw_sends_an_html_page(server: SSEServer, client: httpx.AsyncClient) -> None:
    """raw() sends any body, e.g. a 200 HTML page, with its content type and length."""
    server.enqueue(raw(200, b"<html>login</html>"))
    response = await client.post(CHAT_PATH, json=CHAT_BODY)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html"
    assert response.content == b"<html>login</html>"


async def test_requests_are_recorded_with_headers_and_json(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """Each request is recorded: method, path, lower-cased headers, parsed JSON body."""
    server.enqueue(sse())
    headers = {"Authorization": "Bearer sk-test"}
    await client.post(CHAT_PATH, json=CHAT_BODY, headers=headers)
    [request] = server.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.json == CHAT_BODY


async def test_responses_are_served_fifo_on_a_reused_connection(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """Queued responses answer requests in order, over one kept-alive connection."""
    server.enqueue(sse({"n": 1}), json_response(500, {"error": {"message": "boom"}}))
    _, pieces = await post_and_read(client)
    second = await client.post("/anything", json={})
    assert b'"n":1' in b"".join(pieces)
    assert second.status_code == 500
    assert server.connections_open == 1
    assert [r.path for r in server.requests] == ["/v1/chat/completions", "/v1/anything"]


async def test_an_empty_queue_answers_500_saying_so(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """With nothing queued the server answers 500 with a JSON error naming the problem."""
    response = await client.post(CHAT_PATH, json=CHAT_BODY)
    assert response.status_code == 500
    assert "no scripted response" in response.json()["error"]["message"]


async def test_hang_holds_the_connection_until_the_client_gives_up(server: SSEServer) -> None:
    """Hang sends nothing more: a 0.3 s read timeout fires, and the connection is then closed."""
    server.enqueue(sse({"n": 1}, Hang()))
    timeout = httpx.Timeout(5.0, read=0.3)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=timeout) as client:
        received: list[bytes] = []
        with pytest.raises(httpx.ReadTimeout):
            async with client.stream("POST", CHAT_PATH, json=CHAT_BODY) as response:
                async for piece in response.aiter_raw():
                    received.append(piece)
                    assert server.connections_open == 1
        assert b"".join(received) == b'data: {"n":1}\n\n'
        await server.wait_connections_open(0)


async def test_a_client_leaving_mid_stream_closes_the_connection_at_once(
    server: SSEServer, client: httpx.AsyncClient
) -> None:
    """A client that stops reading mid-drip frees the connection without waiting for the script."""
    server.enqueue(sse(*drip("abcdef", every=1.0)))
    async with client.stream("POST", CHAT_PATH, json=CHAT_BODY) as response:
        async for _ in response.aiter_raw():
            break  # the role chunk is in; the rest would take 6 s
    started = time.monotonic()
    await server.wait_connections_open(0, timeout_s=0.9)
    assert time.monotonic() - started < 0.9  # real: a socket to the test SSE server


async def test_aclose_closes_hanging_connections() -> None:
    """aclose() ends a hanging stream from the server side and leaves no connection open."""
    server = await SSEServer().start()
    server.enqueue(sse(Hang()))
    async with httpx.AsyncClient(base_url=server.base_url, timeout=5.0) as client:
        async with client.stream("POST", CHAT_PATH, json=CHAT_BODY) as response:
            assert server.connections_open == 1
            await server.aclose()
            with pytest.raises(httpx.RemoteProtocolError):
                await response.aread()
    assert server.connections_open == 0


def test_an_event_after_an_ending_step_is_refused() -> None:
    """sse() refuses events after Cut/Reset/Hang, since they could never be sent."""
    with pytest.raises(ValueError, match="put it last"):
        sse({"n": 1}, Cut(), {"n": 2})


async def test_openai_sdk_reassembles_text_and_usage(server: SSEServer) -> None:
    """The official openai SDK parses chat_chunks: text "Hello" and the final usage chunk."""
    server.enqueue(sse(*chat_chunks(["Hel", "lo"], usage=(3, 2))))
    client = AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    finally:
        await client.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (3, 2, 5)
    [request] = server.requests
    assert request.json["stream_options"] == {"include_usage": True}
    assert request.headers["authorization"] == "Bearer sk-test"
