"""An asyncio TCP proxy that injects network faults between a client and a server.

It runs in the test's own event loop (no threads), so a test flips a fault on
and off between two awaits:

    async with FaultProxy("127.0.0.1", server.port) as proxy:
        client = redis.asyncio.Redis.from_url(proxy.url_for())
        proxy.black_hole()        # requests vanish; the client hits its socket timeout
        proxy.heal()
        proxy.reset_all()         # every open connection gets a TCP RST

A fault applies to new and existing connections alike. Delays are fixed when a
chunk is read; black holes and dropped replies are decided when a chunk is due
to be written, so switching them on also catches data already in flight.
"""

from __future__ import annotations

import asyncio
import enum
import random
import socket
import struct
from types import TracebackType

__all__ = ["FaultProxy"]

_CHUNK_BYTES = 65536
_CLOSE_TIMEOUT_S = 1.0
_EOF = None


class _Mode(enum.Enum):
    FORWARD = "forward"
    BLACK_HOLE = "black_hole"
    DROP_REPLIES_THEN_CLOSE = "drop_replies_then_close"


class _Pipe:
    """One proxied connection: two directions, each a reader task and a writer task.

    The reader stamps every chunk with the time it is due and queues it; the
    writer sleeps until then, so delays never reorder a direction and never
    add up across pipelined chunks.
    """

    def __init__(
        self,
        proxy: FaultProxy,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = reader, writer
        self.upstream_writer: asyncio.StreamWriter | None = None

    @property
    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client_writer, self.upstream_writer) if w is not None]

    async def run(self) -> None:
        """Dial the target, pump both directions until either side closes, close both."""
        try:
            upstream_reader, self.upstream_writer = await asyncio.open_connection(
                self.proxy.target_host, self.proxy.target_port
            )
            await self._pump(upstream_reader, self.upstream_writer)
        except OSError:
            pass  # target down: the client just sees its connection closed
        finally:
            await self.close()

    async def _pump(
        self, upstream_reader: asyncio.StreamReader, upstream_writer: asyncio.StreamWriter
    ) -> None:
        up: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        down: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        tasks = [
            asyncio.create_task(self._read(self.client_reader, up, upstream=True)),
            asyncio.create_task(self._read(upstream_reader, down, upstream=False)),
            asyncio.create_task(self._write(up, upstream_writer, upstream=True)),
            asyncio.create_task(self._write(down, self.client_writer, upstream=False)),
        ]
        try:
            await asyncio.wait(tasks[2:], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _read(
        self,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        *,
        upstream: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        due = 0.0
        try:
            while data := await reader.read(_CHUNK_BYTES):
                self.proxy._count(len(data), upstream=upstream)
                # max() keeps the direction in order when jitter shortens a delay.
                due = max(due, loop.time() + self.proxy._next_delay_s())
                queue.put_nowait((due, data))
        except OSError:
            pass  # a reset peer ends the direction just like EOF does
        queue.put_nowait(_EOF)

    async def _write(
        self,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        writer: asyncio.StreamWriter,
        *,
        upstream: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        while (item := await queue.get()) is not _EOF:
            due, data = item
            if (wait_s := due - loop.time()) > 0:
                await asyncio.sleep(wait_s)
            mode = self.proxy._mode
            if mode is _Mode.BLACK_HOLE:
                continue
            if mode is _Mode.DROP_REPLIES_THEN_CLOSE and not upstream:
                return  # the reply is discarded; run() closes the connection
            writer.write(data)
            try:
                await writer.drain()
            except OSError:
                return

    def abort_with_rst(self) -> None:
        """Close both sides with SO_LINGER 0, so each peer gets RST, not FIN."""
        for writer in self.writers:
            sock = writer.get_extra_info("socket")
            if sock is not None and not writer.transport.is_closing():
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

    async def close(self) -> None:
        """Close both sides and wait until the transports are really gone. Idempotent."""
        writers = self.writers
        for writer in writers:
            writer.close()
        for writer in writers:
            try:
                await asyncio.wait_for(writer.wait_closed(), _CLOSE_TIMEOUT_S)
            except (OSError, TimeoutError):
                writer.transport.abort()  # a stuck peer must not hang the test


class FaultProxy:
    """A loopback TCP proxy in front of ``target_host:target_port`` with fault switches.

    Counters: ``connections_total`` (accepted client connections), ``bytes_up``
    (read from clients) and ``bytes_down`` (read from the target), counted
    whether or not a fault then discards the bytes.

        async with FaultProxy("127.0.0.1", 6379) as proxy:
            proxy.delay(0.05, 0.01)
            client = redis.asyncio.Redis.from_url(proxy.url_for(db=1))
    """

    def __init__(self, target_host: str, target_port: int, *, seed: int | None = None) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.connections_total = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self._mode = _Mode.FORWARD
        self._delay_s = 0.0
        self._jitter_s = 0.0
        self._random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._pipes: dict[asyncio.Task[None], _Pipe] = {}

    def __repr__(self) -> str:
        port = self._server and self.port
        return (
            f"FaultProxy(:{port} -> {self.target_host}:{self.target_port}, "
            f"mode={self._mode.value}, delay={self._delay_s}±{self._jitter_s} s, "
            f"open={len(self._pipes)})"
        )

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> FaultProxy:
        """Listen on a free port of 127.0.0.1."""
        if self._server is not None:
            raise RuntimeError(f"{self!r} is already started")
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FaultProxy is not listening: await start() first")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def url_for(self, scheme: str = "redis", db: int = 0, password: str | None = None) -> str:
        """The URL of the target as seen through the proxy, e.g. ``redis://127.0.0.1:P/0``."""
        auth = f":{password}@" if password else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/{db}"

    async def aclose(self) -> None:
        """Stop listening, close every connection and wait for all their tasks."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        pipes = dict(self._pipes)
        for task in pipes:
            if not task.cancelling():
                task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        for pipe in pipes.values():
            await pipe.close()  # a task cancelled before it ran never closed its pipe
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- faults ----------------------------------------------------------------

    def delay(self, mean_s: float, jitter_s: float = 0.0) -> None:
        """Hold every chunk, both ways, for ``mean_s ± jitter_s`` (uniform, never < 0)."""
        if mean_s < 0 or jitter_s < 0:
            raise ValueError(f"delay needs mean_s >= 0 and jitter_s >= 0, got {mean_s}, {jitter_s}")
        self._delay_s, self._jitter_s = mean_s, jitter_s

    def black_hole(self) -> None:
        """Keep reading from both sides but forward nothing; connections stay open."""
        self._mode = _Mode.BLACK_HOLE

    def drop_replies_then_close(self) -> None:
        """Forward requests, but discard the next reply and close that client connection.

        The server has executed the command; the client never learns the outcome.
        """
        self._mode = _Mode.DROP_REPLIES_THEN_CLOSE

    def reset_all(self) -> None:
        """Abort every open connection with a TCP RST. New connections are unaffected."""
        for task, pipe in self._pipes.items():
            pipe.abort_with_rst()
            if not task.cancelling():
                task.cancel()

    def heal(self) -> None:
        """Forward normally again, with no delay."""
        self._mode = _Mode.FORWARD
        self._delay_s = self._jitter_s = 0.0

    # -- internals -------------------------------------------------------------

    def _next_delay_s(self) -> float:
        if not self._jitter_s:
            return self._delay_s
        return max(
            0.0,
            self._random.uniform(self._delay_s - self._jitter_s, self._delay_s + self._jitter_s),
        )

    def _count(self, n: int, *, upstream: bool) -> None:
        if upstream:
            self.bytes_up += n
        else:
            self.bytes_down += n

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Take one client connection into a task this proxy owns and can cancel.

        (Cancelling the handler task asyncio itself makes trips a 3.11 bug that
        logs "Exception in callback", so that callback only hands over.)
        """
        self.connections_total += 1
        if self._server is None:
            writer.close()  # accepted just as aclose() ran: refuse
            return
        pipe = _Pipe(self, reader, writer)
        task = asyncio.create_task(pipe.run())
        self._pipes[task] = pipe
        task.add_done_callback(self._pipes.pop)
