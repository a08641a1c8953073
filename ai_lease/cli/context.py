"""What every ``ai-lease`` command shares: the settings, the store, the prompts, the provider,
and :func:`build_client`, which builds every running :class:`~ai_lease.client.Client` the CLI
uses. Every command reaches the store through a Client, never a store class.

Each is built on first use, so ``--help`` never reads config or imports pydantic-settings,
Jinja2 or a provider SDK, and a command that only looks (``ls``, ``status``) reads the store's
settings through :attr:`Context.look`, without them when it can
(tests/test_import_discipline.py holds the line).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ai_lease.errors import StoreMissing

if TYPE_CHECKING:
    import asyncio

    from ai_lease.client import Client
    from ai_lease.job_provider import ProviderChoice
    from ai_lease.lease.events import EventSink
    from ai_lease.prompts import PromptLibrary
    from ai_lease.providers import Provider
    from ai_lease.run.provider_pick import ProviderResolver
    from ai_lease.settings import Settings
    from ai_lease.settings_look import LookSettings

T = TypeVar("T")


class Context:
    """What every command shares: settings (loaded lazily, so --help never reads config)."""

    def __init__(self, config: Path | None, store_url: str | None, debug: bool) -> None:
        self.config_path, self.store_url, self.debug = config, store_url, debug
        self._settings: Settings | None = None
        self._look: LookSettings | None = None

    @property
    def _overrides(self) -> dict[str, Any]:
        return {"store": {"url": self.store_url}} if self.store_url else {}

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from ai_lease.settings import load_settings

            self._settings = load_settings(self.config_path, **self._overrides)
            _register_secrets(self._settings)
        return self._settings

    @property
    def look(self) -> LookSettings:
        """The store's settings and the lease's renew interval and φ threshold: read
        without pydantic-settings when only those are set (:mod:`ai_lease.settings_look`),
        else from :attr:`settings`; the same values and the same errors either way."""
        if self._look is None:
            from ai_lease.settings_look import LookSettings, quick_look

            quick = (
                None
                if self._settings is not None
                else quick_look(self.config_path, **self._overrides)
            )
            if quick is None:
                quick = LookSettings.of(self.settings)
            else:  # the only secret such settings can hold (no provider, no key)
                from ai_lease.redaction import register_url_secrets

                register_url_secrets(quick.url)
            self._look = quick
        return self._look

    @property
    def where(self) -> str:
        from ai_lease.redaction import mask_url

        return mask_url(self.look.url)

    def client(self, *, create: bool = True) -> Client:
        """A client (looks and tidies) on the configured store; ``create=False`` for a look
        (it never makes one)."""
        from ai_lease.client import Client

        look = self.look
        return Client.open(
            look.url,
            namespace=look.namespace,
            op_timeout=look.op_timeout,
            poll_interval=min(0.05, look.poll_interval),
            create=create,
        )

    def run(
        self,
        work: Callable[[Client], Awaitable[T]],
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
        *,
        create: bool = True,
    ) -> T:
        """Run ``work`` with a client on the configured store (on a loop from
        ``loop_factory``, default asyncio's), closing it afterwards. ``create=False`` (a look:
        status, ls, events, ui, …): a store that does not exist yet is :class:`NoStore`
        (exit 4), never made."""
        import asyncio

        async def main() -> T:
            client = self.client(create=create)
            try:
                return await work(client)
            except StoreMissing as exc:
                raise NoStore(exc) from None
            finally:
                await client.aclose()

        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(main())

    def prompts(self, folders: list[Path] | None = None) -> PromptLibrary:
        """The prompt library, bounded by the settings' ``[job]`` limits."""
        from ai_lease.prompts import PromptLibrary

        job = self.settings.job
        return PromptLibrary(
            folders or [], render_timeout=job.render_timeout, max_output_chars=job.max_prompt_chars
        )

    def provider(self, overrides: dict[str, Any]) -> Provider:
        """The provider the settings name, with a job file's or the flags' overrides. A key
        goes only to the provider family and base URL it was configured for (or an allowed
        host): :mod:`~ai_lease.cli.provider_options`."""
        from ai_lease.cli.provider_options import provider_options
        from ai_lease.providers import create_provider

        name, options = provider_options(self.settings, overrides)
        return create_provider(name, **options)


def build_client(
    client: Client,
    settings: Settings,
    prompts: PromptLibrary,
    *,
    provider: Provider | None = None,
    on_event: EventSink | None = None,
    max_input_bytes: int | None = None,
    provider_resolver: ProviderResolver | None = None,
    provider_serves: ProviderChoice | None = None,
) -> Client:
    """Every client that runs jobs in the CLI, on ``client``'s store (left open: ``client``
    closes it). Without a provider it only records jobs for workers (``submit --detach``);
    with one it runs them under the settings' budgets."""
    import dataclasses

    from ai_lease.inputs import DEFAULT_MAX_INPUT_BYTES

    limit = DEFAULT_MAX_INPUT_BYTES if max_input_bytes is None else max_input_bytes
    config = dataclasses.replace(settings.run_config(), max_input_bytes=limit)
    if provider is None:
        return client.with_runner(provider=None, prompts=prompts, config=config)
    return client.with_runner(
        provider=provider,
        prompts=prompts,
        config=config,
        on_event=on_event,
        provider_resolver=provider_resolver,
        provider_serves=provider_serves,
    )


class NoStore(StoreMissing):
    """A command that only looks found no store where the settings point (exit 4): the
    store's own words, and how to point the CLI at an existing one."""

    def __init__(self, missing: StoreMissing) -> None:
        super().__init__(
            missing.where,
            f"{missing}. To look at an existing one, point --store, AI_LEASE_STORE__URL or "
            "the config file's [store] url at it (the default, sqlite:///.ai-lease/ai-lease.db, "
            "is relative to the current directory)",
        )


def _register_secrets(settings: Settings) -> None:
    """Every secret the settings hold, masked from every text that leaves the process."""
    from ai_lease.redaction import register_secret, register_url_secrets

    endpoints = [(settings.provider.api_key, settings.provider.base_url)]
    endpoints += [(own.api_key, own.base_url) for own in settings.providers.values()]
    for key, base_url in endpoints:
        register_secret(key.get_secret_value() if key is not None else None)
        register_url_secrets(base_url)
    register_url_secrets(settings.store.url)
