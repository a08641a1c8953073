"""A job runs on the provider it asked for, or fails at once saying why (issue 24, item 2).

Jobs are submitted with `ai-lease submit --detach` (a job file's ``[provider]`` table, or the
``--provider`` / ``--model`` flags) and run by a real ``ai-lease worker`` process configured
for another provider; every model server is a loopback test server speaking that
provider's wire format.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from ai_lease import Status, open_store
from ai_lease.job import JobState
from tests.harness.anthropic_server import anthropic_url, message_events, messages_sse
from tests.harness.gemini_server import gemini_sse, gemini_stream
from tests.harness.ollama_server import chat_lines, ndjson, ollama_url
from tests.harness.responses_server import ResponsesServer, text_events
from tests.harness.sse_server import Request, Response, SSEServer, chat_chunks, sse

REAL_TIME = "workers and submits run as subprocesses on a real store"


REPO = Path(__file__).resolve().parent.parent
HOSTED = ("openai", "openai-compatible", "openai-responses", "anthropic", "gemini", "ollama")


def _env(config: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AI_LEASE_", "OPENAI", "ANTHROPIC", "GEMINI", "GOOGLE", "OLLAMA"))
    }
    return env | {"AI_LEASE_CONFIG": str(config)}


async def _cli(workdir: Path, config: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ai_lease",
        *args,
        cwd=workdir,
        env=_env(config),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@asynccontextmanager
async def _worker(workdir: Path, config: Path, url: str, *flags: str) -> AsyncIterator[None]:
    """A real `ai-lease worker`; stopped by SIGTERM at the end, which must exit 0."""
    log = (workdir / "worker.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ai_lease",
        "--store",
        url,
        "worker",
        "--sweep-interval",
        "0.1",
        *flags,
        cwd=workdir,
        env=_env(config),
        stdout=log,
        stderr=log,
    )
    try:
        yield
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 60)
        log.close()
        assert code == 0, (workdir / "worker.log").read_text()


async def _ended(url: str, keys: list[str], timeout_s: float = 90.0) -> dict[str, JobState]:
    """Every job's record once all have ended (a generous bound: the machine is loaded)."""
    store = open_store(url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            records = {k: await store.get(k) for k in keys}
            ended = {k: r for k, r in records.items() if r is not None and r.status.terminal}
            if len(ended) == len(keys):
                return ended
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not ended after {timeout_s} s: {sorted(set(keys) - set(ended))}"
                )
            await asyncio.sleep(0.2)
    finally:
        await store.aclose()


def _always(response: Callable[[], Response]) -> Callable[[Request], Response]:
    return lambda request: response()


def _answer(name: str) -> str:
    return f"answered by {name}"


async def _servers(stack: AsyncExitStack) -> tuple[dict[str, str], dict[str, SSEServer]]:
    """One loopback server per hosted provider, each answering in its own wire format with
    ``answered by <name>``; their base URLs, and the servers (to read their requests)."""
    servers = {
        name: SSEServer(
            responder=_always(lambda n=name: sse(*chat_chunks(["answered ", f"by {n}"])))
        )
        for name in ("openai", "openai-compatible")
    }
    servers["anthropic"] = SSEServer(
        responder=_always(lambda: messages_sse(*message_events([_answer("anthropic")])))
    )
    servers["gemini"] = SSEServer(
        responder=_always(lambda: gemini_sse(*gemini_stream([_answer("gemini")], usage=(3, 2, 5))))
    )
    servers["ollama"] = SSEServer(
        responder=_always(lambda: ndjson(*chat_lines([_answer("ollama")])))
    )
    for server in servers.values():
        await stack.enter_async_context(server)
    responses = await stack.enter_async_context(ResponsesServer())
    for _ in range(4):  # one create per attempt
        responses.script(text_events([_answer("openai-responses")]))
    urls = {name: server.base_url for name, server in servers.items()}
    urls["anthropic"] = anthropic_url(servers["anthropic"])
    urls["ollama"] = ollama_url(servers["ollama"])
    urls["openai-responses"] = responses.base_url
    servers["openai-responses"] = responses.sse
    return urls, servers


def _job_file(workdir: Path, key: str, provider: str = "") -> Path:
    path = workdir / f"{key}.toml"
    path.write_text(
        f'key = "{key}"\nprompt = "summarize"\ninput_file = "article.txt"\n'
        f"[variables]\nsentences = 2\n{provider}"
    )
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "article.txt").write_text((REPO / "examples" / "article.txt").read_text())
    return tmp_path


@pytest.mark.parametrize("isolation", ["task", "process"])
async def test_each_provider_a_job_names_answers_it(workdir: Path, isolation: str) -> None:
    """Detached jobs naming each of the seven providers are answered by that provider,
    not by the worker's own (openai-compatible at another server, another model)."""
    url = f"sqlite:///{workdir / 'jobs.db'}"
    async with AsyncExitStack() as stack:
        urls, servers = await _servers(stack)
        default = await stack.enter_async_context(
            SSEServer(responder=_always(lambda: sse(*chat_chunks(["WRONG: the worker's own"]))))
        )
        config = workdir / "settings.toml"
        # the openai-compatible job names a server the worker is not configured for: listed
        asked = urls["openai-compatible"].split("//")[1].split("/")[0]
        config.write_text(
            '[provider]\nname = "openai-compatible"\n'
            f'base_url = "{default.base_url}"\nmodel = "worker-model"\n'
            f'allowed_hosts = ["{asked}"]\n'
            + "".join(
                f'[providers.{name}]\nbase_url = "{urls[name]}"\napi_key = "k-{name}"\n'
                for name in ("openai", "openai-responses", "anthropic", "gemini")
            )
            + f'[providers.ollama]\nbase_url = "{urls["ollama"]}"\n'
        )
        keys = []
        for name in ("local-extractive", *HOSTED):
            key = f"job-{name}"
            keys.append(key)
            if name == "anthropic":  # the flags, not the table
                job = _job_file(workdir, key)
                flags = ["--provider", "anthropic", "--model", "model-anthropic"]
            else:
                table = f'[provider]\nname = "{name}"\nmodel = "model-{name}"\n'
                if name == "openai-compatible":  # the worker's provider name, another server
                    table += f'base_url = "{urls[name]}"\n'
                job, flags = _job_file(workdir, key, table), []
            code, out, err = await _cli(
                workdir, config, "--store", url, "submit", "--detach", str(job), *flags
            )
            assert code == 0 and out.strip() == key, err
        async with _worker(workdir, config, url, "--isolation", isolation):
            records = await _ended(url, keys)
    for name in ("local-extractive", *HOSTED):
        record = records[f"job-{name}"]
        assert record.status is Status.DONE, (name, record.last_error)
        assert record.provider == name, (name, record.provider)
        text = str(record.output)
        assert "WRONG" not in text, (name, text)
        if name != "local-extractive":
            assert text == _answer(name), (name, text)
            [request] = [r for r in servers[name].requests if r.method == "POST"]
            assert "model-" + name in request.path + str(request.json), (name, request.json)
    assert not default.requests, "the worker's own provider answered a job that named another"


async def test_a_job_whose_provider_cannot_run_here_fails_at_once(workdir: Path) -> None:
    """Unknown provider, no key for it, a host the worker is not configured for (with or
    without a key to go there): FAILED at once (one look, no retry) with the reason, the
    host never called; the worker goes on and exits 0."""
    url = f"sqlite:///{workdir / 'jobs.db'}"
    async with SSEServer() as anthropic:
        config = workdir / "settings.toml"
        config.write_text(
            f'[providers.anthropic]\nbase_url = "{anthropic_url(anthropic)}"\napi_key = "k-a"\n'
        )
        cases = {
            "unknown": ('name = "no-such-provider"\n', "no provider named 'no-such-provider'"),
            "no-key": (
                'name = "gemini"\nmodel = "g"\n',
                "no API key for Gemini: set GEMINI_API_KEY",
            ),
            "refused-host": (
                f'name = "anthropic"\nbase_url = "http://localhost:{anthropic.port}"\n',
                "is not a host this worker is configured for",
            ),
            "unlisted-host-no-key": (  # no key goes with it: still not sent anywhere asked
                f'name = "openai-compatible"\nbase_url = "http://127.0.0.1:{anthropic.port}/v1"\n',
                "add '127.0.0.1:",
            ),
        }
        for key, (table, _) in cases.items():
            job = _job_file(workdir, key, "[provider]\n" + table)
            code, _, err = await _cli(
                workdir, config, "--store", url, "submit", "--detach", str(job)
            )
            assert code == 0, err
        started = time.monotonic()
        async with _worker(workdir, config, url):
            records = await _ended(url, list(cases))
        took = time.monotonic() - started
        code, out, _ = await _cli(workdir, config, "--store", url, "status", "unknown")
    for key, (_, reason) in cases.items():
        record = records[key]
        assert record.status is Status.FAILED, (key, record.status)
        assert reason in (record.last_error or ""), (key, record.last_error)
        assert "cannot run here" in (record.last_error or ""), record.last_error
        assert record.attempts <= 1, (key, record.attempts)
        assert "k-a" not in (record.last_error or "")
    assert took < 60, f"failing four jobs took {took:.1f} s: they were retried"
    assert not anthropic.requests, "a refused host was called"
    assert "FAILED" in out and "no-such-provider" in out


async def test_a_credential_header_is_refused_at_submit(workdir: Path) -> None:
    """[provider] headers carrying a credential: exit 2 naming it, nothing stored."""
    config = workdir / "settings.toml"
    config.write_text("")
    job = _job_file(
        workdir, "h", '[provider]\nname = "openai"\nheaders = { Authorization = "Bearer x" }\n'
    )
    url = f"sqlite:///{workdir / 'jobs.db'}"
    code, _, err = await _cli(workdir, config, "--store", url, "submit", "--detach", str(job))
    assert code == 2, err
    assert "headers.Authorization" in err and "Traceback" not in err, err


# -- the stored choice, and a runner given a provider object -----------------------------------


def test_the_choice_travels_in_the_spec_and_old_jobs_keep_their_fingerprint() -> None:
    """A job's provider choice survives to_spec/from_spec; a job without one keeps the
    fingerprint (and spec) it had before choices were stored."""
    from ai_lease.job import Job, fingerprint
    from ai_lease.job_provider import ProviderChoice

    plain = Job("k", input="text")
    before = {  # the payload as it was before Job had a provider field
        name: getattr(plain, name)
        for name in ("input", "input_file", "prompt", "prompt_text", "variables", "system")
    } | {
        name: getattr(plain, name)
        for name in ("model", "temperature", "max_tokens", "output", "stream")
    }
    assert plain.fingerprint() == fingerprint(before)
    chosen = Job("k", input="text", provider={"name": "anthropic", "headers": {"X-Team": "r"}})
    assert isinstance(chosen.provider, ProviderChoice)
    back = Job.from_spec(chosen.to_spec())
    assert back.provider == chosen.provider and back.fingerprint() == chosen.fingerprint()
    assert back.provider is not None and back.provider.options()["headers"] == {"X-Team": "r"}
    assert chosen.fingerprint() != plain.fingerprint()


@pytest.mark.parametrize(
    ("choice", "named"),
    [
        ({"name": "bad name!"}, "name"),
        ({"model": "x" * 300}, "model"),
        ({"base_url": "ftp://h/"}, "base_url"),
        ({"base_url": "https://user:secret@h/v1"}, "no user, password"),
        ({"base_url": "https://h/v1?key=secret"}, "no user, password or query"),
        ({"headers": {"X-A": "line\nbreak"}}, "headers.X-A"),
        ({"headers": {f"X-{i}": "v" for i in range(40)}}, "headers"),
        ({"headers": {"x-api-key": "secret"}}, "credential"),
        ({"headers": {"X-Auth-Token": "secret"}}, "credential"),
        ({"headers": {"Host": "evil.example"}}, "set by the HTTP client"),
        ({"headers": {1: "a", "b": "c"}}, "must be strings"),
        ({"api_key": "sk-x"}, "unknown field 'api_key'"),
    ],
)
def test_a_bad_choice_is_refused_naming_the_field(choice: dict[str, object], named: str) -> None:
    """Bounds of a stored choice: name, model, base URL, headers; no key field at all."""
    from ai_lease.errors import JobSpecError
    from ai_lease.job import Job

    with pytest.raises(JobSpecError, match="provider choice") as caught:
        Job("k", provider=choice)
    assert named in str(caught.value) and "secret" not in str(caught.value)


async def test_a_runner_given_a_provider_object_serves_only_its_own_name(tmp_path: Path) -> None:
    """Runner(provider=obj) without a resolver: a job naming obj's name runs on it; one
    naming another provider fails before it runs, saying so; with a resolver it runs there."""
    from ai_lease.errors import JobSpecError
    from ai_lease.job import Job
    from ai_lease.providers.local import LocalExtractiveProvider
    from ai_lease.run.runner import Runner
    from ai_lease.testing.scripted import ScriptedProvider

    store = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        runner = Runner(store, provider=LocalExtractiveProvider(pace_s=0))
        text = "One sentence here. Another one there."
        own = await runner.run(Job("own", input=text, provider={"name": "local-extractive"}))
        assert own.status is Status.DONE and own.provider == "local-extractive"
        with pytest.raises(JobSpecError, match="asks for provider 'anthropic'"):
            await runner.run(Job("other", input=text, provider={"name": "anthropic"}))
        assert await store.get("other") is None  # nothing ran, nothing was stored

        scripted = ScriptedProvider(["from the resolver"])
        resolved = Runner(
            store,
            provider=LocalExtractiveProvider(pace_s=0),
            provider_resolver=lambda choice: lambda: scripted,
        )
        record = await resolved.run(Job("via", input=text, provider={"name": "anthropic"}))
        assert record.output == "from the resolver" and record.provider == "scripted"
        await resolved.aclose_providers()
        assert scripted.closed  # built for a job's choice: closed with the runner's providers
    finally:
        await store.aclose()


async def test_connect_takes_a_provider_resolver(tmp_path: Path) -> None:
    """connect(provider_resolver=…): a job naming another provider runs on the resolved
    one, which the client closes as it closes."""
    from ai_lease import connect
    from ai_lease.job import Job
    from ai_lease.testing.scripted import ScriptedProvider

    scripted = ScriptedProvider(["resolved"])
    async with connect(
        f"sqlite:///{tmp_path / 'jobs.db'}", provider_resolver=lambda choice: lambda: scripted
    ) as client:
        record = await client.run(Job("k", input="x.", provider={"name": "gemini"}))
    assert record.output == "resolved" and scripted.closed


async def test_a_submit_left_to_workers_keeps_its_provider(workdir: Path) -> None:
    """Ctrl-C on a foreground submit leaves the job to workers with its [provider]: a
    worker configured for another provider and model finishes it on the one it named."""
    from tests.harness.sse_server import Hang

    def asked(request: Request) -> Response:
        if len(asked_server.requests) == 1:  # the foreground call: hangs until interrupted
            return sse(Hang())
        return sse(*chat_chunks(["answered by ", "the asked model"]))

    url = f"sqlite:///{workdir / 'jobs.db'}"
    async with AsyncExitStack() as stack:
        asked_server = await stack.enter_async_context(SSEServer(responder=asked))
        wrong = await stack.enter_async_context(
            SSEServer(responder=_always(lambda: sse(*chat_chunks(["WRONG"]))))
        )
        config = workdir / "settings.toml"
        listed = f"127.0.0.1:{asked_server.port}"  # the job's own server, allowed by the workers
        config.write_text(
            f'[provider]\nname = "openai-compatible"\nbase_url = "{wrong.base_url}"\n'
            f'model = "worker-model"\nallowed_hosts = ["{listed}"]\n'
        )
        table = (
            '[provider]\nname = "openai-compatible"\nmodel = "asked-model"\n'
            f'base_url = "{asked_server.base_url}"\n'
        )
        job = _job_file(workdir, "left", table)
        submit = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "ai_lease", "--store", url, "submit", str(job)],
            cwd=workdir,
            env=_env(config),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while not asked_server.requests:
            assert time.monotonic() < deadline and submit.returncode is None, "never called"
            await asyncio.sleep(0.05)
        submit.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(submit.communicate(), 60)
        assert submit.returncode == 130 and "left to workers" in err.decode(), err.decode()
        async with _worker(workdir, config, url):
            record = (await _ended(url, ["left"]))["left"]
    assert record.status is Status.DONE, record.last_error
    assert record.output == "answered by the asked model" and record.model == "asked-model"
    assert not wrong.requests
    assert [r.json["model"] for r in asked_server.requests] == ["asked-model"] * 2


def test_a_job_files_provider_table_with_headers_becomes_the_stored_choice(tmp_path: Path) -> None:
    """[provider] name/model/base_url/background/headers -> Job.provider (the stored spec);
    a header that is not a string is refused naming the file and the field."""
    from ai_lease.cli.jobfile import load_job_file
    from ai_lease.errors import JobSpecError
    from ai_lease.job import Job

    table = (
        '[provider]\nname = "openai-responses"\nmodel = "m"\nbackground = true\n'
        'base_url = "http://127.0.0.1:9/v1"\nheaders = { "X-Team" = "research" }\n'
    )
    job = load_job_file(_job_file(tmp_path, "t", table), {"input": "text"}).job
    spec = Job.from_spec(job.to_spec()).provider
    assert spec is not None and spec.options() == {
        "name": "openai-responses",
        "model": "m",
        "base_url": "http://127.0.0.1:9/v1",
        "background": True,
        "headers": {"X-Team": "research"},
    }
    bad = _job_file(tmp_path, "b", '[provider]\nname = "openai"\nheaders = { "X-N" = 1 }\n')
    with pytest.raises(JobSpecError, match=r"b\.toml.*provider\.headers"):
        load_job_file(bad)
