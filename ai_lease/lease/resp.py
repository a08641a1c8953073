"""One multiplexed connection for the lease scripts: the Redis store's fast path.

Every lease operation is one ``EVALSHA``. Through redis-py's asyncio client each costs
~50 µs of client CPU (pool checkout, command packing, the parser, retry wrappers, pool
release); written straight onto one shared connection and matched to its reply in order,
~15 µs (figures in docs/benchmarks.md). Concurrent operations from many jobs share the
connection: Redis answers in order, so the n-th reply belongs to the n-th command.

Semantics the store relies on, kept as redis-py's:

* failures raise redis-py's exceptions (``ConnectionError``, ``ResponseError``,
  ``AuthenticationError``), so the store maps them exactly as before;
* a lost connection fails every operation in flight on it with ``ConnectionError``; the next
  operation connects again (AUTH, SELECT and SCRIPT LOAD go out with it);
* an operation abandoned by its caller (a timeout) leaves its reply to be read and dropped
  in turn, and the connection is kept: under latency the late reply arrives and the next
  operation pays no reconnect. Only if that reply has not come one more timeout later is the
  connection dropped (a black hole, a paused server), so a black hole costs about one op
  timeout per caller, not one per operation queued behind it;
* plain commands (:meth:`Multiplexed.execute`) share the connection, so the queue's calls
  have the lease calls' robustness;
* ``probe`` commands go out with the set-up of every connection (the store's data-loss
  marker is checked there, in the same round trip);
* ``NOSCRIPT`` (a server restarted without persistence) is answered by ``EVAL`` of the full
  script, which caches it again.

Plain TCP and Unix sockets only: ``rediss://``, Redis Cluster and clients with a credential
provider go through redis-py. Replies are parsed by hiredis when it is installed, else by a
small RESP2 parser here; a reply that is not UTF-8 fails its own caller with
``UnicodeDecodeError`` (the store reports the record as corrupt) and the connection every
job shares reads on.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

try:
    import hiredis

    _HIREDIS = True
except ImportError:  # pragma: no cover - hiredis is optional
    _HIREDIS = False

__all__ = ["Multiplexed", "RespParser", "pack"]


def pack(*args: str | bytes | int) -> bytes:
    """One command in RESP2: an array of bulk strings."""
    return b"*%d\r\n" % len(args) + _bulks(args)


def _bulks(args: Sequence[Any]) -> bytes:
    out = []
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class RespParser:
    """An incremental RESP2 reply parser with hiredis' interface (``feed``/``gets``).

    Error replies are returned as :class:`ResponseError` objects, not raised, as hiredis does;
    a reply that is not UTF-8 raises ``UnicodeDecodeError`` once it has been read whole (the
    next reply is read normally), as hiredis does.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0

    def feed(self, data: bytes) -> None:
        self._buf = self._buf[self._pos :] + data if self._pos < len(self._buf) else data
        self._pos = 0

    def gets(self) -> Any:
        """The next whole reply, or ``False`` when more bytes are needed."""
        try:
            reply, pos = self._parse(self._pos)
        except _Incomplete:
            return False
        self._pos = pos
        return _decoded(reply)

    def _parse(self, pos: int) -> tuple[Any, int]:
        buf = self._buf
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            raise _Incomplete
        kind, line, pos = buf[pos : pos + 1], buf[pos + 1 : eol], eol + 2
        if kind == b"+":
            return line, pos
        if kind == b"-":
            return ResponseError(line.decode(errors="replace")), pos
        if kind == b":":
            return int(line), pos
        if kind == b"$":
            size = int(line)
            if size < 0:
                return None, pos
            if len(buf) < pos + size + 2:
                raise _Incomplete
            return buf[pos : pos + size], pos + size + 2
        if kind == b"*":
            count = int(line)
            if count < 0:
                return None, pos
            items = []
            for _ in range(count):
                item, pos = self._parse(pos)
                items.append(item)
            return items, pos
        raise RedisConnectionError(f"Protocol error: unexpected reply type {kind!r}")


class _Incomplete(Exception):
    pass


def _decoded(reply: Any) -> Any:
    if isinstance(reply, bytes):
        return reply.decode()
    if isinstance(reply, list):
        return [_decoded(item) for item in reply]
    return reply


def _reader() -> Any:
    if _HIREDIS:
        return hiredis.Reader(encoding="utf-8", replyError=ResponseError)
    return RespParser()


class _Conn(asyncio.Protocol):
    """The socket side: writes commands, resolves one waiter per reply, in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.reader = _reader()
        self.lost: BaseException | None = None
        self.sent = self.received = 0  # commands written / replies read, for late replies

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reader, waiters = self.reader, self.waiters
        try:
            reader.feed(data)
            while True:
                try:
                    reply = reader.gets()
                except UnicodeDecodeError as exc:  # one corrupt reply: its caller's alone
                    reply = exc
                if reply is False:
                    break
                waiter = waiters.popleft()
                self.received += 1
                if waiter.done():  # its caller may have given up (a timeout)
                    continue
                if isinstance(reply, UnicodeDecodeError):
                    waiter.set_exception(reply)
                else:
                    waiter.set_result(reply)
        except Exception as exc:  # garbage on the wire, or a reply nobody asked for
            self.close(RedisConnectionError(f"Protocol error: {exc!r}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(RedisConnectionError(f"Connection lost: {exc or 'closed by the server'}"))

    def close(self, error: BaseException) -> None:
        if self.lost is None:
            self.lost = error
        if self.transport is not None:
            self.transport.abort()
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    def send(self, command: bytes) -> asyncio.Future[Any]:
        """Write ``command`` now (not batched per loop turn: measured, an immediate write lets
        Redis work while this process goes on, which beats saving the syscall)."""
        if self.lost is not None:
            raise self.lost
        assert self.transport is not None
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        self.sent += 1
        self.transport.write(command)
        return waiter


class Multiplexed:
    """Lease scripts over one shared connection to one Redis server.

    >>> fast = Multiplexed(host="127.0.0.1", port=6379, scripts={sha: text})  # doctest: +SKIP
    >>> await fast.evalsha(sha, ["k:job", "k:events"], ["owner", 30000000])  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        host: str | None = None,
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        scripts: dict[str, str] | None = None,
        connect_timeout: float = 2.0,
        probe: Callable[[], bytes] | None = None,
        on_probe: Callable[[Any], None] | None = None,
    ) -> None:
        if (host is None) == (path is None):
            raise ValueError("Multiplexed: give host (and port) or a Unix socket path")
        self._host, self._port, self._path = host, port, path
        self._db, self._username, self._password = db, username, password
        self._scripts = dict(scripts or {})
        self._connect_timeout = connect_timeout
        self._probe, self._on_probe = probe, on_probe
        self._where = path or f"{host}:{port}"
        self._heads: dict[tuple[str, int], bytes] = {}
        self._conn: _Conn | None = None
        self._connecting: asyncio.Future[_Conn] | None = None
        self._attempt: asyncio.Task[_Conn] | None = None

    @classmethod
    def for_client(
        cls,
        client: Any,
        scripts: dict[str, str],
        connect_timeout: float = 2.0,
        **options: Any,
    ) -> Multiplexed | None:
        """The fast path for a redis-py asyncio client's server, or None where it does not
        apply (TLS, Cluster, a custom connection class, a credential provider)."""
        from redis.asyncio.connection import Connection, UnixDomainSocketConnection

        pool = getattr(client, "connection_pool", None)
        if pool is None or pool.connection_class not in (Connection, UnixDomainSocketConnection):
            return None
        kw = pool.connection_kwargs
        if kw.get("credential_provider") is not None:  # credentials change: redis-py's job
            return None
        return cls(
            host=kw.get("host", "localhost") if "path" not in kw else None,
            port=int(kw.get("port", 6379)),
            path=kw.get("path"),
            db=int(kw.get("db", 0) or 0),
            username=kw.get("username"),
            password=kw.get("password"),
            scripts=scripts,
            connect_timeout=connect_timeout,
            **options,
        )

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.lost is None

    async def connect(self) -> None:
        """Connect (and set up) now, if not connected: the store does this under a deadline
        of its own, so a slow link's set-up round trip is not taken from an operation's."""
        if not self.connected:
            await self._connect()

    async def evalsha(
        self, sha: str, keys: Sequence[str], args: Sequence[Any], deadline: float | None = None
    ) -> Any:
        """Run a loaded script; ``EVAL`` it in full if the server lost its script cache.
        ``deadline`` (the loop's clock): past it, :class:`TimeoutError` — one timer on the
        reply, cheaper than a timeout context per operation."""
        conn = await self._ready(deadline)
        count = b"*%d\r\n" % (3 + len(keys) + len(args))
        command = count + self._evalsha_head(sha, len(keys)) + _bulks((*keys, *args))
        reply = await self._ask(conn, command, deadline)
        if isinstance(reply, ResponseError):
            if not str(reply).startswith("NOSCRIPT") or sha not in self._scripts:
                raise reply
            command = pack("EVAL", self._scripts[sha], len(keys), *keys, *args)
            reply = await self._ask(conn, command, deadline)
            if isinstance(reply, ResponseError):
                raise reply
        return reply

    async def execute(self, *args: str | bytes | int, deadline: float | None = None) -> Any:
        """One plain command on the shared connection; an error reply is raised."""
        reply = await self._ask(await self._ready(deadline), pack(*args), deadline)
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    async def _ready(self, deadline: float | None) -> _Conn:
        conn = self._conn
        if conn is None or conn.lost is not None:
            async with asyncio.timeout_at(deadline):
                conn = await self._connect()
        return conn

    def _evalsha_head(self, sha: str, nkeys: int) -> bytes:
        """``$7 EVALSHA $40 <sha> $k <nkeys>`` (no array count), cached per script."""
        head = self._heads.get((sha, nkeys))
        if head is None:
            head = self._heads[(sha, nkeys)] = pack("EVALSHA", sha, nkeys).split(b"\r\n", 1)[1]
        return head

    async def _ask(self, conn: _Conn, command: bytes, deadline: float | None) -> Any:
        waiter, seq = conn.send(command), conn.sent
        if deadline is None:
            return await waiter
        loop = asyncio.get_running_loop()
        timer = loop.call_at(deadline, _expire, waiter)
        try:
            return await waiter
        except TimeoutError:
            # Keep the connection for a late reply; drop it if even that does not come.
            loop.call_later(self._connect_timeout, self._drop_if_silent, conn, seq)
            raise
        finally:
            timer.cancel()

    def _drop_if_silent(self, conn: _Conn, seq: int) -> None:
        """The reply to command ``seq`` (1-based) has still not come: the link is dead."""
        if conn is self._conn and conn.lost is None and conn.received < seq:
            self.reset()

    def reset(self) -> None:
        """Drop the connection (after a timeout): what is in flight fails, a connection
        being set up is abandoned, the next call connects again."""
        if self._attempt is not None:
            self._attempt.cancel()  # its waiters get ConnectionError (see _connect)
        if self._connecting is not None and not self._connecting.done():
            self._connecting.set_exception(
                RedisConnectionError(
                    f"Error connecting to {self._where}: abandoned after a timeout"
                )
            )
        self._connecting = self._attempt = None
        if self._conn is not None:
            self._conn.close(RedisConnectionError("Connection reset after a timeout"))
            self._conn = None

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.close(RedisConnectionError("Connection closed by the client"))
            self._conn = None

    async def _connect(self) -> _Conn:
        """One connection attempt at a time; callers arriving meanwhile share it. The shared
        outcome is a future of ours, not the attempt's task: :meth:`reset` abandons the
        attempt and its waiters see ``ConnectionError``, never a cancellation of their own."""
        if self._connecting is None:
            loop = asyncio.get_running_loop()
            outcome: asyncio.Future[_Conn] = loop.create_future()
            attempt = loop.create_task(self._open())

            def settle(task: asyncio.Task[_Conn]) -> None:
                if task.cancelled():
                    error: BaseException | None = RedisConnectionError(
                        f"Error connecting to {self._where}: abandoned after a timeout"
                    )
                else:
                    error = task.exception()
                if outcome.done():
                    return
                if error is not None:
                    outcome.set_exception(error)
                else:
                    outcome.set_result(task.result())

            attempt.add_done_callback(settle)
            # Its callers may all have given up (timeouts): the outcome is still consumed.
            outcome.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._connecting, self._attempt = outcome, attempt
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = self._attempt = None

    async def _open(self) -> _Conn:
        try:
            async with asyncio.timeout(self._connect_timeout):  # a connection set up, or none
                return await self._set_up(await self._dial())
        except TimeoutError:
            where = self._path or f"{self._host}:{self._port}"
            raise RedisConnectionError(
                f"Error connecting to {where}: not set up within {self._connect_timeout:g}s"
            ) from None

    async def _dial(self) -> _Conn:
        loop = asyncio.get_running_loop()
        where = self._path or f"{self._host}:{self._port}"
        try:
            if self._path is not None:
                _, conn = await loop.create_unix_connection(_Conn, self._path)
            else:
                assert self._host is not None
                _, conn = await loop.create_connection(_Conn, self._host, self._port)
        except OSError as exc:
            raise RedisConnectionError(f"Error connecting to {where}: {exc}") from None
        return conn

    async def _set_up(self, conn: _Conn) -> _Conn:
        # Set up the connection with one round trip: AUTH, SELECT, and the scripts.
        setup: list[bytes] = []
        if self._password is not None:
            creds = (self._username, self._password) if self._username else (self._password,)
            setup.append(pack("AUTH", *creds))
        if self._db:
            setup.append(pack("SELECT", self._db))
        setup += [pack("SCRIPT", "LOAD", text) for text in self._scripts.values()]
        if self._probe is not None:
            setup.append(self._probe())
        waiters = [conn.send(command) for command in setup]
        try:
            replies = await asyncio.gather(*waiters)
        except BaseException:
            conn.close(RedisConnectionError("Connection setup did not finish"))
            raise
        probed = replies.pop() if self._probe is not None else None
        for reply in replies:
            if isinstance(reply, ResponseError):
                conn.close(RedisConnectionError("Connection setup failed"))
                text = str(reply)
                if "WRONGPASS" in text or "NOAUTH" in text or "AUTH" in text:
                    raise AuthenticationError(text)
                raise reply
        # A probe that fails (a read-only replica, an ACL) costs the probe, not the connection.
        if self._on_probe is not None and not isinstance(probed, ResponseError | None):
            self._on_probe(probed)
        self._conn = conn
        return conn
