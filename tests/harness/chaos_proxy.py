"""The fault proxy, plus one precise fault: lose the reply to one particular request.

:class:`~tests.harness.tcp_proxy.FaultProxy` can drop every reply until healed; a chaos
scenario needs the reply of *one* command lost (the acquire, the commit) while everything
else flows, so that the client's idempotent retry is what is tested:

    async with ChaosProxy("127.0.0.1", server.port) as proxy:
        proxy.drop_reply_to(script_sha(lua.FINISH), b"DONE", times=2)
        ...   # the next two commits are executed by Redis; their replies never arrive
        assert proxy.dropped == 2

A request matches when one chunk read from the client contains every pattern; Redis has
executed it, then the proxy discards its reply and closes that client connection.
"""

from __future__ import annotations

import asyncio
import hashlib

from tests.harness.tcp_proxy import _EOF, FaultProxy, _Mode, _Pipe

__all__ = ["ChaosProxy", "script_sha"]

_CHUNK_BYTES = 65536


def script_sha(script: str) -> bytes:
    """The SHA1 that EVALSHA names a Lua script by (as redis-py computes it)."""
    return hashlib.sha1(script.encode()).hexdigest().encode()


class _MatchingPipe(_Pipe):
    proxy: ChaosProxy

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.drop_reply = False

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
                if upstream and self.proxy._matches(data):
                    self.drop_reply = True
                due = max(due, loop.time() + self.proxy._next_delay_s())
                queue.put_nowait((due, data))
        except OSError:
            pass
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
            if not upstream and (mode is _Mode.DROP_REPLIES_THEN_CLOSE or self.drop_reply):
                self.proxy.dropped += int(self.drop_reply)
                return  # the reply is discarded; run() closes the connection
            writer.write(data)
            try:
                await writer.drain()
            except OSError:
                return


class ChaosProxy(FaultProxy):
    """A :class:`FaultProxy` that can also lose the replies of matching requests."""

    def __init__(self, target_host: str, target_port: int, *, seed: int | None = None) -> None:
        super().__init__(target_host, target_port, seed=seed)
        self._patterns: tuple[bytes, ...] = ()
        self._armed = 0
        self.dropped = 0

    def drop_reply_to(self, *patterns: bytes, times: int = 1) -> None:
        """Lose the replies of the next ``times`` requests containing every pattern."""
        self._patterns, self._armed = patterns, times

    def _matches(self, data: bytes) -> bool:
        if self._armed <= 0 or not all(p in data for p in self._patterns):
            return False
        self._armed -= 1
        return True

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_total += 1
        if self._server is None:
            writer.close()
            return
        pipe = _MatchingPipe(self, reader, writer)
        task = asyncio.create_task(pipe.run())
        self._pipes[task] = pipe
        task.add_done_callback(self._pipes.pop)
