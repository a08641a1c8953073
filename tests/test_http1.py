"""The lean adapter's own HTTP/1.1 client: body framing fed piece by piece, then the
connection handling against a wire-level server on loopback."""

from __future__ import annotations

import asyncio
import gzip
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest

from ai_lease.errors import ConfigError
from ai_lease.providers.http1 import HTTP1Client, HTTP1Error, HTTP1Timeout, Response
from ai_lease.providers.openai_compat import OpenAICompatProvider

# -- framing, fed piece by piece -------------------------------------------------------------


class Fed:
    """Stands in for the socket side of a Response: hands out ``pieces``, then the end."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)
        self.idle_and_open = True

    async def read(self, timeout: float) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def response(headers: dict[str, str], pieces: list[bytes], status: int = 200) -> Response:
    first, rest = (pieces[0], pieces[1:]) if pieces else (b"", [])
    return Response(Fed(rest), status, "OK", headers, first, 1.0, keep_alive=True)  # type: ignore[arg-type]


async def body_of(resp: Response) -> bytes:
    return b"".join([piece async for piece in resp.aiter_body()])


def chunked(*payloads: bytes, trailer: bytes = b"") -> bytes:
    wire = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in payloads)
    return wire + b"0\r\n" + trailer + b"\r\n"


CHUNKED = {"transfer-encoding": "chunked"}
PAYLOADS = (b'data: {"a":1}\n\n', b"x", b"data: [DONE]\n\n")


async def test_chunked_body_split_at_every_byte() -> None:
    """Wherever a read boundary falls (size line, data, CRLF, last chunk), the body is whole."""
    wire = chunked(*PAYLOADS, trailer=b"X-Trailer: 1\r\n")
    for cut in range(len(wire) + 1):
        resp = response(CHUNKED, [wire[:cut], wire[cut:]])
        assert await body_of(resp) == b"".join(PAYLOADS), cut
        assert (resp.complete, resp.reusable) == (True, True)


async def test_chunked_body_in_random_pieces_with_a_large_chunk() -> None:
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(40)] + [b"y" * 300_000]
    wire = chunked(*[p for p in payloads if p])
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(wire)), 30))
        pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
        assert await body_of(response(CHUNKED, pieces)) == b"".join(payloads)


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"zz\r\nab\r\n0\r\n\r\n", "bad chunk size"),
        (b"0x2\r\nab\r\n0\r\n\r\n", "bad chunk size"),
        (b"2\r\nabc\r\n0\r\n\r\n", "longer than its size"),
        (b"5\r\nab", "closed inside a chunked body"),
        (b"f" * 5000, "chunk-size line too long"),
    ],
)
async def test_malformed_chunked_bodies_are_errors(wire: bytes, message: str) -> None:
    with pytest.raises(HTTP1Error, match=message):
        await body_of(response(CHUNKED, [wire]))


async def test_bytes_after_the_last_chunk_make_the_connection_unfit_for_reuse() -> None:
    resp = response(CHUNKED, [chunked(b"ab") + b"HTTP/1.1 200 OK\r\n"])
    assert await body_of(resp) == b"ab"
    assert (resp.complete, resp.reusable) == (True, False)


async def test_content_length_bodies() -> None:
    resp = response({"content-length": "5"}, [b"he", b"llo"])
    assert await body_of(resp) == b"hello"
    assert resp.reusable
    extra = response({"content-length": "2"}, [b"hello"])
    assert await body_of(extra) == b"he"
    assert not extra.reusable
    with pytest.raises(HTTP1Error, match="3 bytes before the body's end"):
        await body_of(response({"content-length": "5"}, [b"he"]))
    with pytest.raises(HTTP1Error, match="bad content-length"):
        await body_of(response({"content-length": "5, 6"}, [b"hello"]))


async def test_a_body_without_framing_ends_with_the_connection() -> None:
    resp = response({}, [b"a", b"b", b"c"])
    assert await body_of(resp) == b"abc"
    assert (resp.complete, resp.reusable) == (True, False)


async def test_compressed_bodies_are_decoded_and_unknown_codings_refused() -> None:
    packed = gzip.compress(b"data: hi\n\n" * 100)
    resp = response(CHUNKED | {"content-encoding": "gzip"}, [chunked(packed[:50], packed[50:])])
    assert await body_of(resp) == b"data: hi\n\n" * 100
    with pytest.raises(HTTP1Error, match="unsupported content-encoding 'br'"):
        await body_of(response({"content-encoding": "br"}, [b"x"]))
    with pytest.raises(HTTP1Error, match="undecodable gzip"):
        await body_of(response({"content-encoding": "gzip"}, [b"not gzip at all"]))


# -- connections, against a wire-level server ------------------------------------------------


@dataclass
class Wire:
    """A loopback server that answers each request with the next script of bytes/pauses.

    A float in a script sleeps; ``b""`` waits until the client closes; ``None`` closes the
    connection there; a script that ends without ``None`` leaves it open for the next request.
    """

    scripts: list[list[bytes | float | None]] = field(default_factory=list)
    heads: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0
    client_gone: asyncio.Event = field(default_factory=asyncio.Event)
    server: asyncio.Server | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/chat?x=1"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.client_gone.set()
                    return
                self.heads.append(head)
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.bodies.append(await reader.readexactly(length))
                for step in self.scripts.pop(0):
                    if step is None:
                        writer.close()
                        return
                    if step == b"":
                        await reader.read()
                        self.client_gone.set()
                        return
                    if isinstance(step, float):
                        await asyncio.sleep(step)
                    else:
                        writer.write(step)
                        await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.client_gone.set()
        except asyncio.CancelledError:
            pass  # the test is over
        finally:
            writer.close()


@pytest.fixture
async def wire() -> AsyncIterator[Wire]:
    served = Wire()
    served.server = await asyncio.start_server(served.handle, "127.0.0.1", 0)
    yield served
    served.server.close()
    for task in served.tasks:
        task.cancel()
    await asyncio.gather(*served.tasks, return_exceptions=True)


@pytest.fixture
async def client() -> AsyncIterator[HTTP1Client]:
    made = HTTP1Client(connect_timeout=2.0, read_timeout=2.0)
    yield made
    await made.aclose()


OK_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def ok(*payloads: bytes) -> list[bytes | float | None]:
    return [OK_HEAD, chunked(*payloads)]


async def fetch(client: HTTP1Client, url: str, headers: dict[str, str] | None = None) -> bytes:
    async with client.stream("POST", url, headers or {}, b'{"q":1}') as resp:
        return await resp.read()


async def test_request_head_and_body_on_the_wire(wire: Wire, client: HTTP1Client) -> None:
    wire.scripts.append(ok(b"hi"))
    assert await fetch(client, wire.url, {"Authorization": "Bearer k"}) == b"hi"
    head = wire.heads[0].decode()
    port = wire.url.split(":")[2].split("/")[0]
    assert head.startswith("POST /v1/chat?x=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{port}\r\n" in head
    assert "Authorization: Bearer k\r\n" in head and "Content-Length: 7\r\n" in head
    assert wire.bodies == [b'{"q":1}']


async def test_keep_alive_reuses_one_connection(wire: Wire, client: HTTP1Client) -> None:
    wire.scripts += [ok(b"one"), ok(b"two"), ok(b"three")]
    assert [await fetch(client, wire.url) for _ in range(3)] == [b"one", b"two", b"three"]
    assert wire.connections == 1


async def test_an_idle_connection_the_server_closed_is_not_reused(
    wire: Wire, client: HTTP1Client
) -> None:
    """The server closes after answering; once its FIN is in, the pool drops that
    connection and the next request goes out once, on a new one."""
    wire.scripts += [[*ok(b"one"), None], ok(b"two")]
    assert await fetch(client, wire.url) == b"one"
    await asyncio.sleep(0.2)  # the FIN arrives
    assert await fetch(client, wire.url) == b"two"
    assert wire.connections == 2
    assert len(wire.bodies) == 2


async def test_a_request_lost_on_a_reused_connection_is_never_sent_again(
    wire: Wire, client: HTTP1Client
) -> None:
    """The server takes the second request and closes without answering (it may have acted
    on it): an error for the caller's retry policy, not a silent second POST."""
    wire.scripts += [ok(b"one"), [0.05, None], ok(b"never")]
    assert await fetch(client, wire.url) == b"one"
    with pytest.raises(HTTP1Error, match="closed the connection without answering"):
        await fetch(client, wire.url)
    assert wire.bodies == [b'{"q":1}', b'{"q":1}']
    assert wire.connections == 1


async def test_idle_connections_expire_before_servers_drop_them(wire: Wire) -> None:
    quick = HTTP1Client(keep_alive=0.05)
    wire.scripts += [ok(b"one"), ok(b"two"), ok(b"three")]
    assert await fetch(quick, wire.url) == b"one"
    assert await fetch(quick, wire.url) == b"two"  # at once: reused
    await asyncio.sleep(0.1)
    assert await fetch(quick, wire.url) == b"three"  # idle too long: a new connection
    assert wire.connections == 2
    await quick.aclose()


async def test_a_reader_stopping_at_the_last_data_leaves_the_connection_reusable(
    wire: Wire, client: HTTP1Client
) -> None:
    """An SSE reader stops at ``[DONE]``, before asking for more: the terminating chunk
    in the same read has been taken already, so the connection carries the next call."""
    wire.scripts += [ok(b"data: 1\n\n", b"data: [DONE]\n\n"), ok(b"next")]
    async with client.stream("POST", wire.url, {}, b"{}") as resp:
        async for piece in resp.aiter_body():
            if piece.endswith(b"data: [DONE]\n\n"):
                break
        assert resp.reusable
    assert await fetch(client, wire.url) == b"next"
    assert wire.connections == 1


async def test_a_new_connection_closed_without_an_answer_is_an_error(
    wire: Wire, client: HTTP1Client
) -> None:
    wire.scripts.append([None])
    with pytest.raises(HTTP1Error, match="closed the connection without answering"):
        await fetch(client, wire.url)
    assert wire.connections == 1  # not sent twice


async def test_leaving_a_body_early_closes_the_connection(wire: Wire, client: HTTP1Client) -> None:
    wire.scripts += [[OK_HEAD, b"5\r\nhello\r\n", b""], ok(b"next")]
    async with client.stream("POST", wire.url, {}, b"{}") as resp:
        async for piece in resp.aiter_body():
            assert piece == b"hello"
            break
    await asyncio.wait_for(wire.client_gone.wait(), 2)
    assert await fetch(client, wire.url) == b"next"
    assert wire.connections == 2


async def test_read_and_connect_failures(wire: Wire) -> None:
    quick = HTTP1Client(connect_timeout=2.0, read_timeout=0.2)
    wire.scripts += [[OK_HEAD, b"2\r\nab\r\n", 5.0], [5.0]]
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(HTTP1Timeout, match=r"no data for 0\.2s"):
        await fetch(quick, wire.url)
    with pytest.raises(HTTP1Timeout, match=r"no data for 0\.2s"):  # silent before the head
        await fetch(quick, wire.url)
    assert loop.time() - started < 2.0
    free = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = free.sockets[0].getsockname()[1]
    free.close()
    await free.wait_closed()
    with pytest.raises(HTTP1Error, match=f"cannot connect to 127.0.0.1:{port}"):
        await fetch(quick, f"http://127.0.0.1:{port}/")
    await quick.aclose()


async def test_informational_answers_are_skipped(wire: Wire, client: HTTP1Client) -> None:
    wire.scripts.append([b"HTTP/1.1 100 Continue\r\n\r\n", *ok(b"after")])
    assert await fetch(client, wire.url) == b"after"


async def test_garbage_instead_of_http_is_an_error(wire: Wire, client: HTTP1Client) -> None:
    wire.scripts.append([b"SSH-2.0-OpenSSH_9.2\r\n\r\n"])
    with pytest.raises(HTTP1Error, match=r"not an HTTP/1\.1 answer"):
        await fetch(client, wire.url)


async def test_headers_with_line_breaks_are_refused(client: HTTP1Client) -> None:
    with pytest.raises(HTTP1Error, match="line break"):
        await fetch(client, "http://127.0.0.1:1/", {"Authorization": "Bearer k\r\nX-Evil: 1"})
    with pytest.raises(HTTP1Error, match="not an http"):
        await fetch(client, "ftp://127.0.0.1/")


async def test_a_large_body_read_slowly_arrives_whole(wire: Wire, client: HTTP1Client) -> None:
    """Reading pauses the socket past the high-water mark and resumes it: nothing lost."""
    payloads = [bytes([i % 251]) * 65536 for i in range(64)]  # 4 MiB
    wire.scripts.append(ok(*payloads))
    got = []
    async with client.stream("POST", wire.url, {}, b"{}") as resp:
        async for piece in resp.aiter_body():
            got.append(piece)
            await asyncio.sleep(0.001)
    assert b"".join(got) == b"".join(payloads)


# -- which path the lean adapter takes -------------------------------------------------------


def test_auto_takes_the_fast_path_only_for_plain_http_without_a_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)

    def path(base_url: str, **options: object) -> str:
        return OpenAICompatProvider(base_url=base_url, api_key="k", **options).http  # type: ignore[arg-type]

    assert path("http://127.0.0.1:8000/v1") == "fast"
    assert path("https://llm.example/v1") == "httpx"
    assert path("https://llm.example/v1", http="fast") == "fast"
    assert path("http://127.0.0.1:8000/v1", http="httpx") == "httpx"
    assert path("http://127.0.0.1:8000/v1", client=httpx.AsyncClient()) == "httpx"
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    assert path("http://llm.internal:8000/v1") == "httpx"
    monkeypatch.setenv("NO_PROXY", "llm.internal")
    assert path("http://llm.internal:8000/v1") == "fast"
    with pytest.raises(ConfigError, match=r"provider\.http: 'h2' is not one of"):
        path("http://127.0.0.1/v1", http="h2")
