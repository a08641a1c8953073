"""The dashboard's front gate over real uvicorn on loopback: a foreign Host (DNS rebinding), a
cross-site state change, an oversized body or header block, guessing the token, a weak token
off loopback, and what the login page shows before anyone logs in."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from ai_lease.job import Status
from ai_lease.lease import LeaseStore
from ai_lease.ui.auth import MIN_TOKEN_BITS, LoginThrottle, token_bits
from ai_lease.ui.gate import MAX_BODY_BYTES, AllowedHosts
from tests.test_ui_app import (
    TOKEN,
    Counting,
    _free_port,
    _make_store,
    csrf_of,
    run_job,
    serving,
)

BIG = "a" * 1_048_576  # one header line of 1 MiB
STRONG = "Zq3v_8KxN0pLr7TmYw2AbC9dE4fGh6Jk"  # 32 characters over four classes


async def test_a_foreign_host_is_refused_before_routing(sqlite_store: LeaseStore) -> None:
    """DNS rebinding: `Host: evil.example` gets 400, no session cookie and no CSRF token; the
    loopback names get the page."""
    await run_job(sqlite_store, "secret-job", "the result")
    async with serving(sqlite_store) as base, httpx.AsyncClient(base_url=base) as client:
        port = base.rsplit(":", 1)[1]
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
            refused = await client.get("/jobs/secret-job", headers={"host": host})
            assert refused.status_code == 400, host
            assert "set-cookie" not in refused.headers and "the result" not in refused.text
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            assert (await client.get("/jobs", headers={"host": host})).status_code == 200, host


async def test_a_cross_site_form_post_changes_nothing(sqlite_store: LeaseStore) -> None:
    """A POST carrying a real session and CSRF token is still 403 when the browser says it
    comes from another site (Origin of another host, Origin null, Sec-Fetch-Site
    cross-site); from our own origin (or `null` with Sec-Fetch-Site same-origin, as our
    no-referrer pages send) it acts."""
    await sqlite_store.submit("waiting", "{}", "fp")  # type: ignore[attr-defined]
    async with serving(sqlite_store) as base, httpx.AsyncClient(base_url=base) as client:
        csrf = csrf_of((await client.get("/jobs/waiting")).text)
        foreign = (
            {"origin": "http://evil.example"},
            {"origin": "null"},
            {"sec-fetch-site": "cross-site"},
            {"sec-fetch-site": "same-site", "origin": base},
        )
        for headers in foreign:
            done = await client.post("/jobs/waiting/remove", data={"csrf": csrf}, headers=headers)
            assert done.status_code == 403, headers
            assert await sqlite_store.get("waiting") is not None
        for own in ({"origin": "null", "sec-fetch-site": "same-origin"}, {"origin": base}):
            assert (await client.get("/jobs/waiting")).status_code == 200
            done = await client.post("/jobs/waiting/retry", data={"csrf": csrf}, headers=own)
            assert done.status_code == 303, own  # let in (a PENDING job is not retried)
        own = {"origin": base, "sec-fetch-site": "same-origin"}
        done = await client.post("/jobs/waiting/cancel", data={"csrf": csrf}, headers=own)
        assert done.status_code == 303
    job = await sqlite_store.get("waiting")
    assert job is not None and job.status is Status.CANCELLED


def _raw(port: int, request: bytes, *, timeout: float = 10.0) -> bytes:
    """Send ``request`` on a fresh connection; what the server answers before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        answer = b""
        try:
            while chunk := sock.recv(65_536):
                answer += chunk
                if b"\r\n\r\n" in answer:
                    break
        except (ConnectionResetError, TimeoutError):
            pass
        return answer


async def test_a_huge_declared_body_is_refused_before_it_is_read(
    sqlite_store: LeaseStore,
) -> None:
    """`POST /login` declaring 800 MB is answered 413 at once, though not a byte of the body
    was sent (nothing waits for it, nothing holds it)."""
    async with serving(sqlite_store, token=TOKEN) as base:
        port = int(base.rsplit(":", 1)[1])
        head = (
            f"POST /login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            "Content-Length: 800000000\r\n\r\n"
        ).encode()
        answer = await asyncio.to_thread(_raw, port, head)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


async def test_a_chunked_body_is_cut_off_as_it_streams_in(sqlite_store: LeaseStore) -> None:
    """A chunked body with no length is cut off at the limit (413), not read to its end."""

    async def endless() -> object:
        for _ in range(10_000):  # 640 MB if it were all read
            yield b"token=" + b"x" * 65_536

    async with serving(sqlite_store, token=TOKEN) as base, httpx.AsyncClient(base_url=base) as c:
        try:
            answer = await c.post("/login", content=endless(), timeout=30)
        except httpx.TransportError:  # the server may close while we are still sending
            answer = None
        if answer is not None:
            assert answer.status_code == 413
        assert (await c.get("/healthz")).status_code == 200
    small = "token=" + "x" * (MAX_BODY_BYTES - 10)
    async with serving(sqlite_store, token=TOKEN) as base, httpx.AsyncClient(base_url=base) as c:
        headers = {"content-type": "application/x-www-form-urlencoded"}
        assert (await c.post("/login", content=small, headers=headers)).status_code == 401


async def test_too_many_headers_are_refused(sqlite_store: LeaseStore) -> None:
    """More than 100 request headers: 431, before routing."""
    async with serving(sqlite_store) as base, httpx.AsyncClient(base_url=base) as client:
        many = {f"x-filler-{i}": "1" for i in range(150)}
        assert (await client.get("/jobs", headers=many)).status_code == 431


async def test_guessing_the_token_is_slowed_per_client(sqlite_store: LeaseStore) -> None:
    """After a few wrong tokens the next try is 429 with Retry-After, and is not even
    checked (the right token is refused too, until the wait is over); then it logs in."""
    now = [1000.0]
    apps: list[Any] = []
    async with (
        serving(sqlite_store, token=TOKEN, apps=apps) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        apps[0].state.ui.guard.throttle = LoginThrottle(clock=lambda: now[0])
        for _ in range(LoginThrottle.FREE + 1):
            assert (await c.post("/login", data={"token": "guess"})).status_code == 401
        slowed = await c.post("/login", data={"token": TOKEN})
        assert slowed.status_code == 429 and int(slowed.headers["retry-after"]) >= 1
        assert "Too many wrong tokens" in slowed.text
        now[0] += 1.5
        assert (await c.post("/login", data={"token": TOKEN})).status_code == 303


def test_the_throttle_doubles_and_stays_bounded() -> None:
    """Each wrong token past the free ones doubles the wait up to a minute; a right one
    clears it; the table forgets the oldest clients past its bound."""
    now = [0.0]
    throttle = LoginThrottle(clock=lambda: now[0])
    waits = []
    for _ in range(LoginThrottle.FREE + 8):
        throttle.failed("c")
        waits.append(throttle.wait_s("c"))
    assert waits[: LoginThrottle.FREE] == [0.0] * LoginThrottle.FREE
    assert waits[LoginThrottle.FREE :] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    throttle.succeeded("c")
    assert throttle.wait_s("c") == 0.0
    for i in range(LoginThrottle.MAX_CLIENTS + 10):
        throttle.failed(f"client-{i}")
    assert len(throttle._clients) == LoginThrottle.MAX_CLIENTS


async def test_the_login_page_says_nothing_about_the_store(sqlite_store: LeaseStore) -> None:
    """Before login neither /login nor the 401 page shows the store URL; after it, it is in
    the header."""
    async with serving(sqlite_store, token=TOKEN) as base, httpx.AsyncClient(base_url=base) as c:
        for path in ("/login", "/jobs"):
            page = await c.get(path, headers={"accept": "text/html"})
            assert "sqlite:" not in page.text and "x.db" not in page.text, path
        assert (await c.post("/login", data={"token": TOKEN})).status_code == 303
        assert "sqlite:///x.db" in (await c.get("/jobs")).text


def test_token_strength_estimates() -> None:
    """Short, repeated or one-class tokens fall short of 128 bits; a random 32-byte one
    does not."""
    assert token_bits(TOKEN) < MIN_TOKEN_BITS  # 18 characters
    assert token_bits("a" * 100) < MIN_TOKEN_BITS
    assert token_bits(STRONG) >= MIN_TOKEN_BITS


def test_allowed_hosts_for_each_kind_of_bind() -> None:
    """Loopback binds answer the three loopback names on their port; a named address only
    itself; a wildcard bind anything (a token is required there) unless names are listed;
    a listed name without a port answers on any port."""
    loop = AllowedHosts.for_bind("127.0.0.1", 9000)
    assert loop.admits("localhost:9000") and loop.admits("[::1]:9000")
    assert not loop.admits("localhost:9001") and not loop.admits("evil.example:9000")
    assert not loop.admits(None) and not loop.admits("")
    six = AllowedHosts.for_bind("::1", 9000)
    assert six.admits("[::1]:9000") and six.admits("127.0.0.1:9000")
    named = AllowedHosts.for_bind("10.1.2.3", 80, ["dash.example.com"])
    assert named.admits("10.1.2.3") and named.admits("dash.example.com:8443")
    assert not named.admits("localhost")
    assert AllowedHosts.for_bind("0.0.0.0", 80).admits("anything.example")
    proxied = AllowedHosts.for_bind("0.0.0.0", 80, ["dash.example.com:443"])
    assert proxied.admits("dash.example.com") and not proxied.admits("anything.example")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ai_lease", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )


def test_a_weak_token_off_loopback_refuses_to_start(sqlite_url: str) -> None:
    """`ui --host 0.0.0.0 --token x` exits 2 naming the 128 bits and how to make a token;
    the token itself is never echoed."""
    done = _cli(
        "--store", sqlite_url, "ui", "--host", "0.0.0.0", "--port", "1", "--token", "hunter2hunter2"
    )
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "128" in line and "secrets.token_urlsafe" in line and "hunter2" not in line


@contextmanager
def _ui_command(tmp_path: Path, *args: str) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """`ai-lease ui` as users start it, on a free port, until it answers /healthz."""
    url, port = f"sqlite:///{tmp_path / 'ui.db'}", _free_port()
    asyncio.run(_make_store(url))
    cmd = [sys.executable, "-m", "ai_lease", "--store", url, "ui", "--port", str(port), *args]
    with subprocess.Popen(cmd, env=_env(), stderr=subprocess.PIPE, text=True) as server:
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                    break
                except httpx.TransportError:
                    assert server.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)  # real: real uvicorn on a loopback socket
            yield port, server
        finally:
            server.terminate()
            server.communicate(timeout=20)


def test_the_command_answers_only_its_names(tmp_path: Path) -> None:
    """`ai-lease ui` refuses a foreign Host (400), answers the loopback names and each
    --allowed-host, and bounds a header block (a 1 MiB header is refused)."""
    with _ui_command(tmp_path, "--allowed-host", "dash.example.com") as (port, _):
        get = lambda host: httpx.get(f"http://127.0.0.1:{port}/jobs", headers={"host": host})  # noqa: E731
        assert get(f"evil.example:{port}").status_code == 400
        assert get(f"localhost:{port}").status_code == 200
        assert get("dash.example.com").status_code == 200
        answer = _raw(
            port,
            f"GET /jobs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Big: {BIG}\r\n\r\n".encode(),
        )
        assert not answer.startswith(b"HTTP/1.1 200"), answer[:100]


def test_the_command_on_ipv6_loopback_prints_a_usable_address(tmp_path: Path) -> None:
    """`ui --host [::1]` (or ::1) binds ::1 and prints http://[::1]:PORT/, which answers."""
    port = _free_port()
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    asyncio.run(_make_store(url))
    cmd = [
        sys.executable,
        "-m",
        "ai_lease",
        "--store",
        url,
        "ui",
        "--host",
        "[::1]",
        "--port",
        str(port),
    ]
    with subprocess.Popen(cmd, env=_env(), stderr=subprocess.PIPE, text=True) as server:
        try:
            assert server.stderr is not None
            line = server.stderr.readline()
            assert f"http://[::1]:{port}/" in line, line
            assert httpx.get(f"http://[::1]:{port}/jobs", timeout=5).status_code == 200
        finally:
            server.terminate()
            server.communicate(timeout=20)


async def test_live_streams_are_capped_and_freed(sqlite_store: LeaseStore) -> None:
    """Past max_streams a live page's stream is 503 (with Retry-After); closing one frees
    its slot for the next."""
    await run_job(sqlite_store, "watched")
    apps: list[Any] = []
    async with serving(sqlite_store, refresh=0.1, max_streams=3, apps=apps) as base:
        slots = apps[0].state.ui.streams
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            opened = [client.stream("GET", "/live/jobs") for _ in range(3)]
            streams = [await s.__aenter__() for s in opened]
            assert [s.status_code for s in streams] == [200, 200, 200]
            extra = await client.get("/live/jobs/watched")
            assert extra.status_code == 503 and extra.headers["retry-after"] == "5"
            await opened[0].__aexit__(None, None, None)
            deadline = time.monotonic() + 10
            while slots.open > 2:
                assert time.monotonic() < deadline, slots
                await asyncio.sleep(0.05)  # real: real uvicorn on a loopback socket
            async with client.stream("GET", "/live/jobs/watched") as again:
                assert again.status_code == 200
            for s in opened[1:]:
                await s.__aexit__(None, None, None)


async def test_pages_on_one_view_share_one_read_per_interval(sqlite_store: LeaseStore) -> None:
    """Twenty pages open on the same jobs view cost about one store read per refresh, not
    twenty."""
    await run_job(sqlite_store, "still")
    counting = Counting(sqlite_store)
    async with (
        serving(counting, refresh=0.2) as base,
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        opened = [client.stream("GET", "/live/jobs") for _ in range(20)]
        for s in opened:
            await s.__aenter__()
        before, started = counting.reads, time.monotonic()
        await asyncio.sleep(2.0)  # real: real uvicorn on a loopback socket
        reads, elapsed = counting.reads - before, time.monotonic() - started
        for s in opened:
            await s.__aexit__(None, None, None)
    # a jobs view is two reads (a page and the counts) per refresh: 20 pages unshared ≈ 400
    assert reads <= 2 * 3 * (elapsed / 0.2 + 2), (reads, elapsed)


async def test_pages_of_different_views_never_share_a_read(sqlite_store: LeaseStore) -> None:
    """Two live pages on different pages of the same filter each get their own rows."""
    for i in range(3):
        await run_job(sqlite_store, f"k{i}")
    async with (
        serving(sqlite_store, refresh=0.1) as base,
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        firsts = []
        for query in ("", "?after=k2", "?prefix=k0"):
            async with aconnect_sse(client, "GET", "/live/jobs" + query) as source:
                firsts.append((await anext(source.aiter_sse())).data)
    assert len(set(firsts)) == 3, firsts
