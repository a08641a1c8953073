"""The provider a job asks for, built from this node's settings (``submit``, ``worker``).

A job's :class:`~ai_lease.job_provider.ProviderChoice` (its job file's ``[provider]``
table, stored with the job) is resolved against the settings of the node that runs it:
the key for that provider, its base URL and the hosts a key may go to are that node's
(:func:`~ai_lease.cli.provider_options.provider_options`). A choice naming another provider
than the settings' ``provider.name`` and no model gets no model from the settings (that
model belongs to the settings' provider): the job's own ``model``, else the adapter's default.
A choice's ``base_url`` must be one this node's operator configured for that provider, its
vendor's default, or a host in ``provider.allowed_hosts``: whoever can submit a job must not
make the workers send requests wherever they like.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ai_lease.errors import ConfigError

if TYPE_CHECKING:
    from ai_lease.job_provider import ProviderChoice
    from ai_lease.run.isolation import ProviderFactory
    from ai_lease.settings import Settings

__all__ = ["SettingsProviders", "choice_overrides"]


def choice_overrides(settings: Settings, choice: ProviderChoice | None) -> dict[str, Any]:
    """``provider_options`` overrides for ``choice`` (None: the settings' provider as is)."""
    if choice is None:
        return {}
    overrides = choice.options()
    if choice.name not in (None, settings.provider.name) and choice.model is None:
        overrides["model"] = None  # not the settings' model: it is another provider's
    return overrides


class SettingsProviders:
    """A :data:`~ai_lease.run.provider_pick.ProviderResolver` from ``settings``: a job's
    choice -> a picklable :class:`ProviderFactory`; a :class:`ConfigError` saying why not
    (an unknown provider, a base URL its key may not go to)."""

    def __init__(self, settings: Settings, default_name: str | None = None) -> None:
        self.settings = settings
        self.default_name = default_name or settings.provider.name  # for a choice naming none

    def __call__(self, choice: ProviderChoice) -> ProviderFactory:
        import dataclasses

        from ai_lease.cli.provider_options import provider_options
        from ai_lease.providers import available_providers
        from ai_lease.run.isolation import ProviderFactory

        if choice.name is None:
            choice = dataclasses.replace(choice, name=self.default_name)
        name = choice.name or self.default_name
        known = available_providers()
        if name not in known:
            raise ConfigError(
                f"no provider named {name!r} is installed here (known: {', '.join(known)})"
            )
        if choice.base_url is not None:
            _check_job_base_url(self.settings, name, choice.base_url)
        name, options = provider_options(self.settings, choice_overrides(self.settings, choice))
        return ProviderFactory(name, **options)


def _check_job_base_url(settings: Settings, name: str, base_url: str) -> None:
    """A stored job's base URL must be one this node's operator configured for that
    provider (or its vendor's default), or a host ``provider.allowed_hosts`` lists."""
    from ai_lease.providers import BUILTINS
    from ai_lease.providers.keys import check_job_destination

    cfg, own = settings.provider, settings.providers.get(name)
    builtin = BUILTINS.get(name)
    trusted = (
        cfg.base_url if name == cfg.name else None,
        own.base_url if own is not None else None,
        builtin.base_url if builtin is not None else None,
    )
    check_job_destination(base_url, trusted, cfg.allowed_hosts)
