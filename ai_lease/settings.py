"""Settings at the edge: environment ``AI_LEASE_*`` over a TOML file over defaults.

>>> settings = load_settings(env={"AI_LEASE_LEASE__TTL": "12"})
>>> settings.lease_timings().ttl
12.0

:func:`load_settings` is the only place that reads the environment or a file. It hands
back a :class:`Settings`, which converts into the plain value objects the library takes
(:meth:`Settings.lease_timings`, :meth:`Settings.stream_timeouts`,
:meth:`Settings.retry_policy`). ``Settings(...)`` itself takes values only.

Every problem raises :class:`ConfigError` with one line per problem: where the value came
from, the dotted field and the rule. Secrets (``provider.api_key``, a password in
``store.url``) never appear in a repr, a dump or an error. :mod:`ai_lease.settings_sources`
reads the file and the environment; :mod:`ai_lease.settings_errors` words the problems.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationError,
    field_serializer,
    field_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ai_lease import settings_sources as sources
from ai_lease.errors import ConfigError
from ai_lease.inputs import DEFAULT_MAX_INPUT_BYTES
from ai_lease.prompts import DEFAULT_MAX_PROMPT_CHARS
from ai_lease.redaction import mask_url
from ai_lease.run.config import RunConfig
from ai_lease.settings_errors import Loc, Origins, allowed, report, rule, where
from ai_lease.settings_limits import LimitsSettings
from ai_lease.settings_provider import EndpointSettings, ProviderSettings, _Section
from ai_lease.settings_sources import CONFIG_ENV_VAR, DEFAULT_CONFIG_PATH, ENV_DELIMITER, ENV_PREFIX
from ai_lease.settings_ui import UiSettings
from ai_lease.settings_worker import WorkerSettings
from ai_lease.stores.urls import SCHEMES
from ai_lease.timeouts import (
    DEFAULT_STAGE_BUDGETS,
    AdaptiveBudgets,
    LeaseTimings,
    RetryPolicy,
    StageBudget,
    StallPolicy,
    StreamLimits,
    StreamTimeouts,
)

__all__ = [
    "CONFIG_ENV_VAR",
    "DEFAULT_CONFIG_PATH",
    "ENV_PREFIX",
    "AdaptiveSettings",
    "EndpointSettings",
    "JobSettings",
    "LeaseSettings",
    "ProviderSettings",
    "RetrySettings",
    "Settings",
    "StageSettings",
    "StoreSettings",
    "StreamSettings",
    "load_settings",
    "mask_url",
]

STORE_SCHEMES = SCHEMES

DAY_S = 86_400.0
WEEK_S = 7 * DAY_S
# Every number has an upper bound: a value past it is a typo (or an attack), and the stores
# write times as 64-bit microseconds, which a TTL of 1e13 s would overflow.
Seconds = Annotated[float, Field(gt=0, le=DAY_S, allow_inf_nan=False)]
"""A positive, finite duration in seconds, at most one day."""
Bound = Seconds
"""A hard bound in seconds: positive, finite, at most one day (a large value means "long")."""
Count = Annotated[int, Field(ge=1, le=1000)]
"""A small positive count (attempts, misses)."""
Factor = Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)]
"""A positive, finite multiplier."""

MAX_EVENT_BYTES = 1 << 30
MAX_ANSWER_BYTES = 1 << 32


class StoreSettings(_Section):
    """Where leases live and how long one store operation may take."""

    url: str = "sqlite:///.ai-lease/ai-lease.db"
    op_timeout: Seconds = 2.0
    poll_interval: Seconds = 1.0
    namespace: str = Field(default="ai_lease", min_length=1)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        scheme = url.partition("://")[0].lower() if "://" in url else ""
        if scheme not in STORE_SCHEMES:
            raise ValueError(
                f"must start with one of {', '.join(s + '://' for s in STORE_SCHEMES)} "
                f"(got {mask_url(url)!r})"
            )
        return url

    @field_serializer("url")
    def _masked_url(self, url: str) -> str:
        return mask_url(url)

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            yield name, mask_url(value) if name == "url" else value


class LeaseSettings(_Section):
    """How a lease is held, and what happens when its job stalls."""

    ttl: Seconds = 30.0
    renew_interval: Seconds = 5.0
    stall_after_misses: Count = 1
    stall_policy: StallPolicy = StallPolicy.EXPIRE
    self_fence_margin: Bound = 2.0
    job_deadline: Annotated[float, Field(gt=0, le=WEEK_S, allow_inf_nan=False)] = 3600.0
    # From submission to the first acquisition; None (the default): no bound.
    queue_deadline: Annotated[float, Field(gt=0, le=WEEK_S, allow_inf_nan=False)] | None = None
    phi_threshold: float = Field(default=8.0, ge=6, le=10)  # φ at which health says suspect


class AdaptiveSettings(_Section):
    """Learned budgets from recorded stage durations (see ``ai-lease tune``)."""

    enabled: bool = False
    factor: Factor = 1.5
    floor: Seconds = 1.0
    min_samples: int = Field(default=200, ge=1, le=1_000_000_000)
    refresh_interval: Seconds = 60.0


class StageSettings(_Section):
    """One stage's budgets: longest stretch without progress, and its hard deadline."""

    max_no_progress: Seconds
    deadline: Bound


class StreamSettings(_Section):
    """Budgets and size limits of one streamed model call."""

    first_token: Bound = 60.0
    idle: Bound = 30.0
    total: Bound = 600.0
    idle_policy: Literal["fixed", "phi"] = "fixed"  # "phi": φ decides idle, `idle` the bound
    finish_grace: Bound = 2.0  # after the finish: how long a trailing usage / [DONE] may take
    max_event_bytes: Annotated[int, Field(ge=1, le=MAX_EVENT_BYTES)] = StreamLimits.max_event_bytes
    max_answer_bytes: Annotated[int, Field(ge=1, le=MAX_ANSWER_BYTES)] = (
        StreamLimits.max_answer_bytes
    )


class RetrySettings(_Section):
    """Attempts of a whole job, with exponential backoff between them."""

    attempts: Count = 3
    initial: Seconds = 1.0
    multiplier: float = Field(default=2.0, ge=1, le=100, allow_inf_nan=False)
    max_backoff: Seconds = 30.0


class JobSettings(_Section):
    """Bounds on what preparing one job may take: its input, and its prompt's rendering."""

    max_input_bytes: int = Field(default=DEFAULT_MAX_INPUT_BYTES, ge=1, le=2**31)
    render_timeout: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = 5.0
    max_prompt_chars: int = Field(default=DEFAULT_MAX_PROMPT_CHARS, ge=1, le=2**31)


def _budget_fields(budget: StageBudget) -> dict[str, float]:
    return {"max_no_progress": budget.max_no_progress, "deadline": budget.deadline}


class Settings(BaseSettings):
    """Every knob of ai_lease; build it with :func:`load_settings` at the edge.

    >>> Settings(lease={"ttl": 60}).lease_timings().ttl
    60.0
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    store: StoreSettings = StoreSettings()
    lease: LeaseSettings = LeaseSettings()
    # Validated like any input, so the empty default becomes the seed's budgets.
    stages: dict[str, StageSettings] = Field(default_factory=dict)
    stream: StreamSettings = StreamSettings()
    retry: RetrySettings = RetrySettings()
    provider: ProviderSettings = ProviderSettings()
    # Per provider name: its own base URL and key, used whenever a job names that provider
    # ([providers.anthropic] api_key = …, or AI_LEASE_PROVIDERS__ANTHROPIC__API_KEY).
    providers: dict[str, EndpointSettings] = Field(default_factory=dict)
    adaptive: AdaptiveSettings = AdaptiveSettings()
    job: JobSettings = JobSettings()
    ui: UiSettings = UiSettings()  # ai-lease ui: host, port, token, refresh
    worker: WorkerSettings = WorkerSettings()  # ai-lease worker: isolation, terminate_grace
    limits: LimitsSettings = LimitsSettings()  # [limits."openai:gpt-4o-mini"] concurrency = 4

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Values only: load_settings() reads the environment and the file itself, so it can
        # refuse unknown variables and say where each bad value came from.
        return (init_settings,)

    @field_validator("stages", mode="before")
    @classmethod
    def _over_defaults(cls, stages: Any) -> Any:
        """A stage table overrides, field by field, the budget the stage would get anyway."""
        if not isinstance(stages, Mapping):
            return stages
        merged: dict[Any, Any] = {n: _budget_fields(b) for n, b in DEFAULT_STAGE_BUDGETS.items()}
        for name, entry in stages.items():
            base = merged.get(name, _budget_fields(LeaseTimings.default_budget))
            merged[name] = {**base, **entry} if isinstance(entry, Mapping) else entry
        return merged

    def __init__(self, *, _origins: Origins | None = None, **values: Any) -> None:
        """Validate ``values``; ``_origins`` says where each came from, for the errors.

        Every problem raises one :class:`ConfigError`; input values (secrets) are never shown.
        """
        try:
            super().__init__(**values)
            problems = self._cross_field_problems()
        except ValidationError as exc:
            problems = [
                (_public_loc(err["loc"]), rule(err) + allowed(err, Settings))
                for err in exc.errors(include_input=False)
            ]
        # Raised outside the except block, so no __context__ carries the inputs along.
        if problems:
            raise ConfigError(report((where(_origins, loc), loc, r) for loc, r in problems))

    def _cross_field_problems(self) -> list[tuple[Loc, str]]:
        """The value objects' own rules (renew_interval <= ttl/2, ...), under settings names."""
        problems: list[tuple[Loc, str]] = []
        for build in (
            self.lease_timings,
            self.stream_timeouts,
            self.stream_limits,
            self.retry_policy,
        ):
            try:
                build()
            except ConfigError as exc:
                name, _, rule = str(exc).partition(": ")
                problems.append((_settings_loc(name), rule))
        return problems

    def lease_timings(self) -> LeaseTimings:
        """The lease budgets, with every stage's budget, as the library's value object."""
        lease, store = self.lease, self.store
        return LeaseTimings(
            ttl=lease.ttl,
            renew_interval=lease.renew_interval,
            op_timeout=store.op_timeout,
            poll_interval=store.poll_interval,
            stall_after_misses=lease.stall_after_misses,
            stall_policy=lease.stall_policy,
            self_fence_margin=lease.self_fence_margin,
            job_deadline=lease.job_deadline,
            queue_deadline=math.inf if lease.queue_deadline is None else lease.queue_deadline,
            stage_budgets={
                name: StageBudget(stage.max_no_progress, stage.deadline)
                for name, stage in self.stages.items()
            },
        )

    def adaptive_budgets(self) -> AdaptiveBudgets | None:
        """The adaptive-budget mode, or None when it is off."""
        a = self.adaptive
        if not a.enabled:
            return None
        return AdaptiveBudgets(a.factor, a.floor, a.min_samples, a.refresh_interval)

    def stream_timeouts(self) -> StreamTimeouts:
        """The first-token, idle and total budgets of a streamed call."""
        s = self.stream
        return StreamTimeouts(
            s.first_token, s.idle, s.total, s.idle_policy, self.lease.phi_threshold, s.finish_grace
        )

    def stream_limits(self) -> StreamLimits:
        """How big one event and one answer of a streamed call may grow."""
        return StreamLimits(self.stream.max_event_bytes, self.stream.max_answer_bytes)

    def retry_policy(self) -> RetryPolicy:
        """How often, and after how long, a failed job is attempted again."""
        return RetryPolicy(**self.retry.model_dump())

    def run_config(self) -> RunConfig:
        """What a runner runs under, from these settings: lease timings, job retries,
        stream budgets and limits, adaptive budgets, the input size bound and the provider
        limits."""
        return RunConfig(
            timings=self.lease_timings(),
            retry=self.retry_policy(),
            stream_timeouts=self.stream_timeouts(),
            stream_limits=self.stream_limits(),
            adaptive=self.adaptive_budgets(),
            max_input_bytes=self.job.max_input_bytes,
            limits=self.limits.call_limits(),
        )


_SECTIONS = {
    "LeaseTimings": "lease",
    "StreamTimeouts": "stream",
    "StreamLimits": "stream",
    "RetryPolicy": "retry",
}


def _public_loc(loc: Loc) -> Loc:
    """A field's location as a user writes it: ``limits.<name>.concurrency``, without the
    ``each`` the section keeps its limits under."""
    if tuple(loc[:2]) == ("limits", "each"):
        return ("limits", *loc[2:])
    return loc


def _settings_loc(name: str) -> Loc:
    """The settings field behind a value object's: LeaseTimings.op_timeout -> store.op_timeout."""
    owner, _, field = name.partition(".")
    if field in StoreSettings.model_fields:
        return ("store", field)
    return (_SECTIONS.get(owner, "stages"), field)


def load_settings(
    config_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Settings from ``overrides`` > environment ``AI_LEASE_*`` > TOML file > defaults.

    The file is ``config_path``, else ``$AI_LEASE_CONFIG``, else ``config/ai-lease.toml``
    if it exists. ``env`` defaults to ``os.environ``.

    >>> load_settings(env={}, lease={"ttl": 60}).lease.ttl
    60.0
    """
    ours = sources.our_variables(os.environ if env is None else env)
    from_env = ours.pop(CONFIG_ENV_VAR, None)
    entries: list[sources.Entry] = []
    path = sources.config_file(config_path, from_env)
    if path is not None:
        entries += sources.leaves(sources.read_toml(path), (), str(path))
    entries += sources.env_entries(ours, Settings)
    entries += sources.leaves(overrides, (), "argument")
    data, origins = sources.merge(entries)
    return Settings(_origins=origins, **data)
