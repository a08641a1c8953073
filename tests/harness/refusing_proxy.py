"""A :class:`FaultProxy` that can also refuse connections: a store that is down for a while.

    async with RefusingProxy("127.0.0.1", server.port) as proxy:
        store = open_store(proxy.url_for())
        proxy.refuse()            # every open connection gets an RST, new ones ECONNREFUSED
        await proxy.accept()      # listening again, on the same port

Refusing closes the listening socket, so a client's connect fails with "connection
refused" (nothing was sent), and aborts every open connection with a TCP RST (whatever was
in flight has an unknown outcome): the two failures a store client meets when its server
goes away.
"""

from __future__ import annotations

import asyncio

from tests.harness.tcp_proxy import FaultProxy

__all__ = ["RefusingProxy"]


class RefusingProxy(FaultProxy):
    """``FaultProxy`` plus :meth:`refuse` / :meth:`accept` (see the module docstring)."""

    _port: int | None = None

    async def start(self) -> RefusingProxy:
        await super().start()
        self._port = super().port
        return self

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("RefusingProxy is not listening: await start() first")
        return self._port

    @property
    def refusing(self) -> bool:
        return self._port is not None and self._server is None

    def refuse(self) -> None:
        """Stop listening (connects are refused) and reset every open connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.reset_all()

    async def accept(self) -> None:
        """Listen again on the same port."""
        if self._server is None:
            self._server = await asyncio.start_server(
                self._accept, "127.0.0.1", self.port, reuse_address=True
            )

    async def refuse_for(self, seconds: float) -> None:
        """:meth:`refuse`, then :meth:`accept` after ``seconds``."""
        self.refuse()
        await asyncio.sleep(seconds)
        await self.accept()
