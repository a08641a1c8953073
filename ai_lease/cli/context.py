"""What every ``ai-lease`` command shares: the settings, the store, the prompts, the provider.

Each is built on first use, so ``--help`` never reads config or imports pydantic-settings,
Jinja2 or a provider SDK (tests/test_import_discipline.py holds the line).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ai_lease.errors import ConfigError

if TYPE_CHECKING:
    import asyncio

    from pydantic import SecretStr

    from ai_lease.lease import LeaseStore
    from ai_lease.prompts import PromptLibrary
    from ai_lease.providers import Provider
    from ai_lease.settings import Settings

T = TypeVar("T")


class Context:
    """What every command shares: settings (loaded lazily, so --help never reads config)."""

    def __init__(self, config: Path | None, store_url: str | None, debug: bool) -> None:
        self.config_path, self.store_url, self.debug = config, store_url, debug
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from ai_lease.settings import load_settings

            overrides: dict[str, Any] = {"store": {"url": self.store_url}} if self.store_url else {}
            self._settings = load_settings(self.config_path, **overrides)
            _register_secrets(self._settings)
        return self._settings

    @property
    def where(self) -> str:
        from ai_lease.lease import mask_url

        return mask_url(self.settings.store.url)

    def open_store(self) -> LeaseStore:
        from ai_lease.lease import open_store

        store = self.settings.store
        return open_store(
            store.url,
            namespace=store.namespace,
            op_timeout=store.op_timeout,
            poll_interval=min(0.05, store.poll_interval),
        )

    def run(
        self,
        work: Callable[[LeaseStore], Awaitable[T]],
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    ) -> T:
        """Run ``work`` against the configured store (on a loop from ``loop_factory``, default
        asyncio's), closing it afterwards."""
        import asyncio

        async def main() -> T:
            store = self.open_store()
            try:
                return await work(store)
            finally:
                await store.aclose()

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
        """The provider the settings name, with a job file's or the flags' overrides. The
        key goes only to the base URL it was configured for (or an allowed host)."""
        from ai_lease.providers import create_provider
        from ai_lease.providers.keys import check_key_destination

        cfg = self.settings.provider
        name = overrides.get("name", cfg.name)
        key = None if name == "local-extractive" else cfg.api_key or _ambient_key()
        base_url = overrides.get("base_url", cfg.base_url)
        if key is not None and base_url is not None and base_url != cfg.base_url:
            check_key_destination(base_url, cfg.base_url, cfg.allowed_hosts)
        options = {"model": overrides.get("model", cfg.model), "base_url": base_url, "api_key": key}
        if name in ("openai", "openai-compatible"):
            # The settings' sampling values are the provider's defaults: a job's own win.
            options["temperature"] = cfg.temperature
            options["max_tokens"] = cfg.max_tokens
            options["max_event_bytes"] = self.settings.stream.max_event_bytes
        if name == "openai-compatible":
            options["http"] = cfg.http
        return create_provider(name, **options)


def _ambient_key() -> SecretStr | None:
    """``OPENAI_API_KEY``, checked like a configured key (and masked from then on)."""
    from pydantic import SecretStr

    from ai_lease.providers.keys import check_api_key
    from ai_lease.redaction import register_secret

    key = os.environ.get("OPENAI_API_KEY") or None
    if key is None:
        return None
    try:
        check_api_key(key)
    except ValueError as exc:
        raise ConfigError(f"environment OPENAI_API_KEY: {exc}") from None
    register_secret(key)
    return SecretStr(key)


def _register_secrets(settings: Settings) -> None:
    """Every secret the settings hold, masked from every text that leaves the process."""
    from ai_lease.redaction import register_secret, register_url_secrets

    key = settings.provider.api_key
    register_secret(key.get_secret_value() if key is not None else None)
    register_url_secrets(settings.store.url)
    register_url_secrets(settings.provider.base_url)
