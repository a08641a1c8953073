"""Settings: sources and their precedence, errors that name field and rule, secrets kept out."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
from pydantic import SecretStr

from ai_lease.errors import ConfigError
from ai_lease.settings import Settings, load_settings, mask_url
from ai_lease.timeouts import (
    DEFAULT_STAGE_BUDGETS,
    LeaseTimings,
    RetryPolicy,
    StageBudget,
    StallPolicy,
    StreamTimeouts,
)

SHIPPED_CONFIG = Path(__file__).resolve().parents[1] / "config" / "ai-lease.toml"
CANARY = "sk-CANARY-1234"


@pytest.fixture(autouse=True)
def _empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run each test where no config/ai-lease.toml exists, unless the test writes one."""
    monkeypatch.chdir(tmp_path)


def toml(tmp_path: Path, text: str, name: str = "ai-lease.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def config_error(**kwargs: object) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(**kwargs)  # type: ignore[arg-type]
    return str(caught.value)


def full_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


# --- defaults and the shipped file ----------------------------------------------------


def test_defaults_are_the_seed_budgets() -> None:
    """With no file and no environment, every knob has the seed's value."""
    settings = load_settings(env={})
    assert settings.store.url == "sqlite:///.ai-lease/ai-lease.db"
    assert (settings.lease.ttl, settings.lease.renew_interval) == (30.0, 5.0)
    assert settings.lease.stall_policy is StallPolicy.EXPIRE
    assert settings.stream_timeouts() == StreamTimeouts()
    assert settings.retry_policy() == RetryPolicy()
    assert settings.lease_timings() == LeaseTimings()
    assert settings.provider.name == "local-extractive"
    assert settings.provider.api_key is None


def test_shipped_toml_gives_exactly_the_defaults() -> None:
    """config/ai-lease.toml loads cleanly and changes nothing."""
    assert load_settings(SHIPPED_CONFIG, env={}) == Settings()


def test_default_file_is_read_from_cwd(tmp_path: Path) -> None:
    """Without a path or AI_LEASE_CONFIG, config/ai-lease.toml in the CWD is read."""
    (tmp_path / "config").mkdir()
    toml(tmp_path / "config", "[lease]\nttl = 40\n")
    assert load_settings(env={}).lease.ttl == 40.0


def test_config_path_from_environment(tmp_path: Path) -> None:
    """AI_LEASE_CONFIG names the file, and is not itself an unknown setting."""
    path = toml(tmp_path, "[lease]\nttl = 44\n", name="other.toml")
    assert load_settings(env={"AI_LEASE_CONFIG": str(path)}).lease.ttl == 44.0


def test_config_argument_beats_environment_path(tmp_path: Path) -> None:
    """An explicit config path wins over AI_LEASE_CONFIG."""
    given = toml(tmp_path, "[lease]\nttl = 50\n", name="given.toml")
    other = toml(tmp_path, "[lease]\nttl = 60\n", name="other.toml")
    assert load_settings(given, env={"AI_LEASE_CONFIG": str(other)}).lease.ttl == 50.0


# --- precedence -------------------------------------------------------------------------


def test_environment_overrides_toml(tmp_path: Path) -> None:
    """An AI_LEASE_* variable wins over the file; the file's other values stay."""
    path = toml(tmp_path, "[lease]\nttl = 40\nrenew_interval = 4\n")
    settings = load_settings(path, env={"AI_LEASE_LEASE__TTL": "50"})
    assert (settings.lease.ttl, settings.lease.renew_interval) == (50.0, 4.0)


def test_nested_environment_variable() -> None:
    """AI_LEASE_LEASE__TTL=12 sets lease.ttl; unrelated variables are ignored."""
    settings = load_settings(env={"AI_LEASE_LEASE__TTL": "12", "PATH": "/bin"})
    assert settings.lease.ttl == 12.0
    assert settings.lease_timings().ttl == 12.0


def test_arguments_override_environment() -> None:
    """Explicit keyword values win over the environment, field by field."""
    env = {"AI_LEASE_LEASE__TTL": "40", "AI_LEASE_LEASE__RENEW_INTERVAL": "4"}
    settings = load_settings(env=env, lease={"ttl": 60})
    assert (settings.lease.ttl, settings.lease.renew_interval) == (60.0, 4.0)


def test_partial_stage_table_keeps_other_defaults(tmp_path: Path) -> None:
    """Overriding one field of one stage keeps that stage's other field and every other stage."""
    path = toml(tmp_path, "[stages.call_ai]\nmax_no_progress = 120\n")
    env = {"AI_LEASE_STAGES__PARSE__DEADLINE": "90"}
    budgets = load_settings(path, env=env).lease_timings().stage_budgets
    assert budgets["call_ai"] == StageBudget(120.0, 600.0)
    assert budgets["parse"] == StageBudget(5.0, 90.0)
    for name in ("validate", "load", "build_prompt", "persist"):
        assert budgets[name] == DEFAULT_STAGE_BUDGETS[name]


def test_new_stage_starts_from_the_default_budget(tmp_path: Path) -> None:
    """A stage the seed does not know gets the default budget for the fields it omits."""
    path = toml(tmp_path, "[stages.summarize]\nmax_no_progress = 30\n")
    budgets = load_settings(path, env={}).lease_timings().stage_budgets
    assert budgets["summarize"] == StageBudget(30.0, LeaseTimings.default_budget.deadline)


# --- unknown keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("bogus = 1\n", "bogus"),
        ("[bogus]\nx = 1\n", "bogus"),
        ("[lease]\ntll = 30\n", "lease.tll"),
        ("[stages.call_ai]\nmax_no_progres = 1\n", "stages.call_ai.max_no_progres"),
    ],
)
def test_unknown_toml_key_is_an_error(tmp_path: Path, text: str, field: str) -> None:
    """An unknown key at any level of the file fails, naming the file and the key."""
    path = toml(tmp_path, text)
    message = config_error(config_path=path, env={})
    assert f"{path}: {field}: unknown key" in message


@pytest.mark.parametrize(
    "name",
    ["AI_LEASE_LEASE__TLL", "AI_LEASE_BOGUS", "AI_LEASE_LEASE", "AI_LEASE_STAGES__CALL_AI"],
)
def test_unknown_environment_variable_is_an_error(name: str) -> None:
    """An AI_LEASE_* variable that names no field fails instead of being ignored."""
    message = config_error(env={name: "1"})
    assert f"environment {name}: " in message
    assert "unknown key" in message


# --- bad values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"AI_LEASE_LEASE__TTL": "-1"}, "lease.ttl: must be greater than 0"),
        ({"AI_LEASE_LEASE__TTL": "abc"}, "lease.ttl: must be a number"),
        (
            {"AI_LEASE_LEASE__STALL_POLICY": "nap"},
            "lease.stall_policy: must be one of expire, release, alert",
        ),
        ({"AI_LEASE_RETRY__ATTEMPTS": "0"}, "retry.attempts: must be at least 1"),
        (
            {"AI_LEASE_PROVIDER__HTTP": "h2"},
            "provider.http: must be one of auto, aiohttp, httpx",
        ),
        (  # the old name of aiohttp is gone: a 0.1 package keeps no aliases
            {"AI_LEASE_PROVIDER__HTTP": "fast"},
            "provider.http: must be one of auto, aiohttp, httpx",
        ),
        (
            {"AI_LEASE_STORE__URL": "ftp://host/x"},
            "store.url: must start with one of sqlite://, redis://, rediss://, unix://",
        ),
    ],
)
def test_bad_value_names_source_field_and_rule(env: dict[str, str], expected: str) -> None:
    """A bad value fails at load with the variable, the dotted field and the rule."""
    (name,) = env
    assert f"environment {name}: {expected}" in config_error(env=env)


def test_cross_field_rule_is_named_by_settings_field(tmp_path: Path) -> None:
    """renew_interval > ttl/2 is reported as lease.renew_interval, from where it was set."""
    path = toml(tmp_path, "[lease]\nttl = 30\nrenew_interval = 20\n")
    message = config_error(config_path=path, env={})
    assert f"{path}: lease.renew_interval: must be at most half of ttl" in message


def test_store_timeout_rule_is_named_under_store() -> None:
    """The value object's op_timeout rule surfaces as store.op_timeout."""
    message = config_error(env={"AI_LEASE_STORE__OP_TIMEOUT": "9"})
    assert "AI_LEASE_STORE__OP_TIMEOUT: store.op_timeout: must be shorter than" in message


def test_every_problem_gets_its_own_line(tmp_path: Path) -> None:
    """Several problems are reported together, one line each."""
    path = toml(tmp_path, '[lease]\nttl = -1\nstall_policy = "nap"\n')
    lines = config_error(config_path=path, env={}).splitlines()
    assert len(lines) == 3
    assert any("lease.ttl" in line for line in lines)
    assert any("lease.stall_policy" in line for line in lines)


def test_direct_construction_raises_config_error() -> None:
    """Settings(...) also raises ConfigError, never a pydantic ValidationError."""
    with pytest.raises(ConfigError, match=r"lease\.ttl: must be greater than 0"):
        Settings(lease={"ttl": 0})


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    """A TOML syntax error names the file and the line, without a TOML traceback."""
    path = toml(tmp_path, "[lease]\nttl = 30\nrenew_interval 5\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert str(path) in str(caught.value)
    assert "line 3" in str(caught.value)
    assert caught.value.__cause__ is None


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_missing_config_file_is_named(tmp_path: Path, via: str) -> None:
    """A config path that was given but does not exist fails, naming the path."""
    missing = tmp_path / "nope.toml"
    if via == "argument":
        message = config_error(config_path=missing, env={})
    else:
        message = config_error(env={"AI_LEASE_CONFIG": str(missing)})
    assert str(missing) in message


# --- secrets ----------------------------------------------------------------------------


def test_api_key_from_environment_stays_hidden() -> None:
    """An API key from the environment is hidden in repr, str and JSON, and revealed on demand."""
    settings = load_settings(env={"AI_LEASE_PROVIDER__API_KEY": CANARY})
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert CANARY not in text
    assert isinstance(settings.provider.api_key, SecretStr)
    assert settings.provider.api_key.get_secret_value() == CANARY


def test_secrets_from_toml_stay_hidden(tmp_path: Path) -> None:
    """An API key and a URL password from the file never show in repr, str or JSON."""
    path = toml(
        tmp_path,
        f'[store]\nurl = "redis://:{CANARY}@cache:6379/0"\n[provider]\napi_key = "{CANARY}"\n',
    )
    settings = load_settings(path, env={})
    for text in (repr(settings), str(settings), repr(settings.store), settings.model_dump_json()):
        assert CANARY not in text
    assert "redis://:***@cache:6379/0" in repr(settings)
    assert settings.store.url == f"redis://:{CANARY}@cache:6379/0"


@pytest.mark.parametrize(
    "env",
    [
        {"AI_LEASE_PROVIDER__MAX_TOKENS": CANARY},
        {"AI_LEASE_PROVIDER__TEMPERATURE": CANARY},
        {"AI_LEASE_STORE__URL": f"ftp://user:{CANARY}@host/0"},
        {"AI_LEASE_LEASE__TLL": CANARY},
    ],
)
def test_secret_never_in_environment_errors(env: dict[str, str]) -> None:
    """A bad value holding a secret fails without the secret in the message or traceback."""
    with pytest.raises(ConfigError) as caught:
        load_settings(env=env)
    assert CANARY not in full_text(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        f'[provider]\napi_key = ["{CANARY}"]\n',
        f'[provider]\nmax_tokens = "{CANARY}"\n',
        f'[store]\nurl = "ftp://user:{CANARY}@host"\n',
        f'[provider]\napi_kee = "{CANARY}"\n',
        f'[provider]\napi_key = "{CANARY}\n',
    ],
)
def test_secret_never_in_toml_errors(tmp_path: Path, text: str) -> None:
    """A bad file holding a secret fails without the secret in the message or traceback."""
    with pytest.raises(ConfigError) as caught:
        load_settings(toml(tmp_path, text), env={})
    assert CANARY not in full_text(caught.value)


def test_bad_url_error_shows_the_masked_url() -> None:
    """A URL with a bad scheme is named in its masked form."""
    message = config_error(env={"AI_LEASE_STORE__URL": f"ftp://user:{CANARY}@host"})
    assert "ftp://user:***@host" in message


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://user:pw@host/1", "rediss://user:***@host/1"),
        ("redis://:p@ss/w?rd@host/0", "redis://:***@host/0"),
        ("unix:///run/redis.sock?db=0&password=pw", "unix:///run/redis.sock?db=0&password=***"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("sqlite:///.ai-lease/ai-lease.db", "sqlite:///.ai-lease/ai-lease.db"),
        (
            "postgresql://u:pw@db:5432/jobs?sslmode=require",
            "postgresql://u:***@db:5432/jobs?sslmode=require",
        ),
        (
            "postgresql:///jobs?host=/run/pg&password=pw",
            "postgresql:///jobs?host=/run/pg&password=***",
        ),
        ("host=db password=pw dbname=jobs", "host=db password=*** dbname=jobs"),
        ("host=db password = 'p w\\' x' dbname=jobs", "host=db password = *** dbname=jobs"),
        (  # libpq's sslpassword (the client key's passphrase) is a secret too
            "postgresql://db/jobs?sslmode=verify-full&sslpassword=hunter22",
            "postgresql://db/jobs?sslmode=verify-full&sslpassword=***",
        ),
        ("host=db sslpassword=hunter22 dbname=jobs", "host=db sslpassword=*** dbname=jobs"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    """mask_url replaces any password, in the user info or the query, with ***."""
    assert mask_url(url) == masked


# --- value objects ----------------------------------------------------------------------


def test_conversion_to_value_objects(tmp_path: Path) -> None:
    """Settings convert into the library's frozen value objects, field for field."""
    path = toml(
        tmp_path,
        "[store]\nop_timeout = 1.5\npoll_interval = 0.5\n"
        '[lease]\nttl = 20\nrenew_interval = 4\nstall_after_misses = 2\nstall_policy = "release"\n'
        "self_fence_margin = 3\njob_deadline = 86400\n"
        "[stream]\nfirst_token = 45\nidle = 15\ntotal = 300\n"
        "[retry]\nattempts = 5\ninitial = 0.5\nmultiplier = 3\nmax_backoff = 10\n",
    )
    settings = load_settings(path, env={})
    timings = settings.lease_timings()
    assert (timings.ttl, timings.renew_interval) == (20.0, 4.0)
    assert (timings.op_timeout, timings.poll_interval) == (1.5, 0.5)
    assert (timings.stall_after_misses, timings.stall_policy) == (2, StallPolicy.RELEASE)
    assert (timings.self_fence_margin, timings.job_deadline) == (3.0, 86400.0)
    assert timings.stage_budgets == DEFAULT_STAGE_BUDGETS
    assert settings.stream_timeouts() == StreamTimeouts(first_token=45, idle=15, total=300)
    expected_retry = RetryPolicy(attempts=5, initial=0.5, multiplier=3, max_backoff=10)
    assert settings.retry_policy() == expected_retry


# --- every number is bounded ---------------------------------------------------------------


def _numeric_settings() -> list[str]:
    """Every numeric setting's dotted name (stages through one named stage)."""
    names = []
    for section, field in Settings.model_fields.items():
        model = field.annotation
        if section == "stages":
            names += ["stages.call_ai.max_no_progress", "stages.call_ai.deadline"]
            continue
        if section == "providers":  # base URLs and keys: nothing numeric
            continue
        for name, sub in model.model_fields.items():  # type: ignore[union-attr]
            text = str(sub.annotation)
            if sub.annotation in (int, float) or "int" in text or "float" in text:
                names.append(f"{section}.{name}")
    return names


NUMERIC_SETTINGS = _numeric_settings()
BAD_NUMBERS = ["1e13", "nan", "inf", "-1", "0"]


def _cli_config(env: dict[str, str], *args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from ai_lease.cli.app import main

    result = CliRunner().invoke(main, [*args, "config"], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return result.exit_code, result.output


def test_the_numeric_settings_are_all_found() -> None:
    """The bound table covers the settings that overflowed or busy-looped before."""
    assert {"lease.ttl", "store.op_timeout", "retry.attempts", "provider.max_tokens"} <= set(
        NUMERIC_SETTINGS
    )
    assert len(NUMERIC_SETTINGS) >= 20


@pytest.mark.parametrize("value", BAD_NUMBERS)
@pytest.mark.parametrize("name", NUMERIC_SETTINGS)
def test_out_of_range_number_is_exit_2_naming_field_and_range(
    tmp_path: Path, name: str, value: str
) -> None:
    """1e13, nan, inf, -1 and 0 (where 0 is invalid) are refused from the environment and
    from a TOML file: exit 2, the dotted field named with the range it allows."""
    if value == "0" and name in ("provider.temperature", "worker.terminate_grace"):
        return  # 0 is a valid temperature, and a valid grace (SIGKILL at once)
    variable = "AI_LEASE_" + name.upper().replace(".", "__")
    code, output = _cli_config({variable: value})
    assert code == 2, output
    assert f"environment {variable}: {name}: " in output and "(allowed: " in output, output
    assert "Traceback" not in output
    *tables, leaf = name.split(".")
    path = toml(tmp_path, f"[{'.'.join(tables)}]\n{leaf} = {value}\n")
    code, output = _cli_config({}, "--config", str(path))
    assert code == 2, output
    assert f"{path}: {name}: " in output and "(allowed: " in output, output


def test_ttl_1e13_is_refused_with_its_bound() -> None:
    """The TTL that overflowed the stores' 64-bit microsecond times is refused at load."""
    message = config_error(env={"AI_LEASE_LEASE__TTL": "1e13"})
    assert "lease.ttl: must be at most 86400 (allowed: 0 < x <= 86400)" in message


def test_values_at_the_bounds_are_accepted() -> None:
    """The largest allowed values load (the bounds are inclusive)."""
    settings = load_settings(
        env={
            "AI_LEASE_LEASE__TTL": "86400",
            "AI_LEASE_LEASE__JOB_DEADLINE": str(7 * 86400),
            "AI_LEASE_RETRY__ATTEMPTS": "1000",
        }
    )
    assert settings.lease.ttl == 86400.0 and settings.retry.attempts == 1000


# --- the [worker] section (ai_lease/settings_worker.py) --------------------------------------


def test_worker_settings_come_from_the_file_and_the_environment(tmp_path: Path) -> None:
    """[worker] isolation and terminate_grace load from TOML; AI_LEASE_WORKER__* beats it."""
    path = toml(tmp_path, '[worker]\nisolation = "process"\nterminate_grace = 30\n')
    from_file = load_settings(config_path=path, env={}).worker
    assert (from_file.isolation, from_file.terminate_grace) == ("process", 30.0)
    env = {"AI_LEASE_WORKER__ISOLATION": "task", "AI_LEASE_WORKER__TERMINATE_GRACE": "0"}
    from_env = load_settings(config_path=path, env=env).worker
    assert (from_env.isolation, from_env.terminate_grace) == ("task", 0.0)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"AI_LEASE_WORKER__ISOLATION": "thread"},
            "worker.isolation: must be one of task, process",
        ),
        (
            {"AI_LEASE_WORKER__TERMINATE_GRACE": "301"},
            "worker.terminate_grace: must be at most 300",
        ),
        (
            {"AI_LEASE_WORKER__TERMINATE_GRACE": "-1"},
            "worker.terminate_grace: must be at least 0",
        ),
    ],
)
def test_a_bad_worker_setting_names_its_field(env: dict[str, str], expected: str) -> None:
    """An unknown isolation or a grace outside 0-300 s: the variable, field and rule."""
    (name,) = env
    assert f"environment {name}: {expected}" in config_error(env=env)


def test_the_worker_settings_bound_is_the_workers() -> None:
    """The settings' grace bound is the one the worker itself enforces."""
    from ai_lease.run.isolation import MAX_TERMINATE_GRACE
    from ai_lease.settings_worker import MAX_TERMINATE_GRACE_S

    assert MAX_TERMINATE_GRACE_S == MAX_TERMINATE_GRACE


def test_the_redactor_masks_libpq_sslpassword() -> None:
    """An sslpassword in a URL query or a libpq keyword string never reaches a log line or
    an error message."""
    from ai_lease.redaction import redact

    text = redact("dsn postgresql://db/j?sslpassword=hunter22 or host=db sslpassword=hunter22")
    assert "hunter22" not in text and text.count("sslpassword=***") == 2
