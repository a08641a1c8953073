"""``ai-lease ui``: serve the web dashboard over the store the other commands use.

It binds 127.0.0.1 by default and needs no token there; any other address needs ``--token``
(or ``AI_LEASE_UI__TOKEN``, or ``[ui] token``): without one it refuses to start, before
binding, with one line and exit 2. A port in use (or an address that is not this
machine's) is one line and exit 2 too; the address is printed only once the server answers
there. It only looks: with no store where the settings point it says so in one line and
exits 4 before it listens (it never creates one; `ai-lease submit` does). Starlette and
uvicorn come with the ``ui`` extra and are imported only here, when the command runs.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from ai_lease.cli.context import Context

if TYPE_CHECKING:
    from ai_lease.client import Client

MISSING_EXTRA = "ai-lease ui needs the ui extra: pip install 'ai_lease[ui]'"
_HOST_NAME = re.compile(r"[\w.\-\[\]:]{1,255}")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine (``localhost``, 127.0.0.0/8, ``::1``).

    >>> is_loopback("127.0.0.1"), is_loopback("0.0.0.0"), is_loopback("localhost")
    (True, False, True)
    """
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _refuse(line: str) -> NoReturn:
    click.echo(f"ai-lease: error: {line}", err=True)
    sys.exit(2)


@click.command(short_help="Serve the live web dashboard (jobs, timelines, workers).")
@click.option("--host", default=None, help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=click.IntRange(0, 65_535), default=None, help="Port (default 8377).")
@click.option(
    "--token", default=None, help="Access token (or AI_LEASE_UI__TOKEN); needed off loopback."
)
@click.option(
    "--refresh",
    type=click.FloatRange(0.05, 60),
    default=None,
    help="Seconds between live updates (default 1).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME[:PORT]",
    help="Another Host name to answer (a reverse proxy's); repeatable.",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the dashboard in a browser.")
@click.pass_obj
def ui(
    obj: Context,
    host: str | None,
    port: int | None,
    token: str | None,
    refresh: float | None,
    allowed_hosts: tuple[str, ...],
    open_browser: bool,
) -> None:
    """Serve the dashboard at http://HOST:PORT/: jobs (live), one job's timeline, workers,
    cancel/retry/remove, /metrics and /healthz.

    It answers only requests whose Host is a name it was bound under (127.0.0.1, localhost
    and [::1] on loopback) or one given with --allowed-host: a web page cannot reach it by
    pointing its own name at this machine. A non-loopback --host needs a token of at least
    128 bits."""
    try:
        import uvicorn

        from ai_lease.ui.app import create_app
    except ImportError:
        _refuse(MISSING_EXTRA)
    conf = obj.settings.ui
    host = host or conf.host
    port = conf.port if port is None else port
    if token is None and conf.token is not None:
        token = conf.token.get_secret_value()
    if token:
        from ai_lease.providers.keys import check_api_key

        try:
            check_api_key(token)
        except ValueError as exc:
            _refuse(f"--token: {exc}")
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):  # [::1] as in a URL: bind ::1
        host = host[1:-1]
    for name in allowed_hosts:
        if not _HOST_NAME.fullmatch(name):
            _refuse(f"--allowed-host {name!r}: give a host name or address, NAME or NAME:PORT")
    if not is_loopback(host):
        _check_off_loopback(host, token)
    from ai_lease.redaction import register_secret

    register_secret(token)
    options = {
        "token": token or None,
        "refresh": refresh or conf.refresh,
        "phi_threshold": obj.settings.lease.phi_threshold,
        "lease_ttl": obj.settings.lease.ttl,
        "allowed_hosts": (*conf.allowed_hosts, *allowed_hosts),
    }
    _serve(obj, uvicorn, create_app, host, port, options, open_browser)


_NEW_TOKEN_HINT = (
    "e.g. --token \"$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')\""
)


def _check_off_loopback(host: str, token: str | None) -> None:
    """Off loopback, a token is required, and a guessable one is refused."""
    from ai_lease.ui.auth import MIN_TOKEN_BITS, token_bits

    if not token:
        _refuse(
            f"--host {host} is not a loopback address: pass --token (or set "
            f"AI_LEASE_UI__TOKEN) so only people with it can see and cancel jobs; "
            f"{_NEW_TOKEN_HINT}"
        )
    if token_bits(token) < MIN_TOKEN_BITS:
        _refuse(
            f"--token is too easy to guess for --host {host} (about {token_bits(token):.0f} "
            f"bits; off loopback it needs at least {MIN_TOKEN_BITS}): {_NEW_TOKEN_HINT}"
        )


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` and listening, or one line and exit 2 (the
    port in use, the address not this machine's, a host that does not resolve)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )[0]
    except socket.gaierror as exc:
        _refuse(f"--host {host}: cannot resolve it ({exc.strerror}): pass an address")
    sock = socket.socket(family, kind, proto)  # IPPROTO_TCP: asyncio then sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            _refuse(f"port {port} on {host} is in use: pick another with --port")
        _refuse(f"cannot listen on {host} port {port} ({exc.strerror}): pick another --host")
    return sock


def _serve(
    obj: Context,
    uvicorn: Any,
    create_app: Any,
    host: str,
    port: int,
    options: dict[str, Any],
    open_browser: bool,
) -> None:
    import asyncio

    # A look: a dashboard over no store has nothing to show (its actions act on existing
    # jobs), so a store that is not there is one line and exit 4, before it listens.
    obj.run(_store_is_there, create=False)
    sock = listen_socket(host, port)
    port = int(sock.getsockname()[1])  # --port 0: the one the system chose
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"

    from ai_lease.ui.gate import MAX_HEADER_BYTES, AllowedHosts

    hosts = AllowedHosts.for_bind(host, port, options.pop("allowed_hosts"))

    async def main(client: Client) -> None:
        app = create_app(client, settings_view={"store": obj.where}, hosts=hosts, **options)
        config = uvicorn.Config(
            app,
            log_level="warning",
            timeout_graceful_shutdown=2,
            lifespan="on",
            server_header=False,
            http="h11",  # its header limit below; httptools (if installed) has none to set
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        )
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        # uvicorn says it is up with a flag only (no event to wait on).
        while not server.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        if server.started:  # the address only once it answers
            click.echo(f"ai-lease ui: {url} (store {obj.where}); Ctrl-C stops", err=True)
            if open_browser:
                import webbrowser

                asyncio.get_running_loop().call_later(0.5, webbrowser.open, url)
        await serving

    try:
        obj.run(main, create=False)
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        sock.close()


COMMANDS = (ui,)


async def _store_is_there(client: Client) -> None:
    """Touch the store (opened with ``create=False``: a missing one raises). A corrupt record
    is the dashboard's to show, marked, not a reason to refuse to start."""
    from ai_lease.errors import CorruptRecord

    try:
        await client.list(limit=1)
    except CorruptRecord:
        pass
