"""The ``[ui]`` section of the settings: where ``ai-lease ui`` listens and who may look.

>>> UiSettings().port
8377

``token`` (``AI_LEASE_UI__TOKEN``) is a secret: never shown in a repr, a dump or an error.
A host other than a loopback address needs one (the command refuses to start without it).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr, field_validator

from ai_lease.settings_provider import _checked_key, _Section

__all__ = ["UiSettings"]


class UiSettings(_Section):
    """The dashboard's address, its access token and how often live pages refresh."""

    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8377, ge=1, le=65_535)
    token: SecretStr | None = None
    refresh: Annotated[float, Field(ge=0.05, le=60, allow_inf_nan=False)] = 1.0
    # Host names (NAME or NAME:PORT) a reverse proxy sends, besides the bound ones
    allowed_hosts: Annotated[
        tuple[Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[\w.\-\[\]:]+$")], ...],
        Field(max_length=64),
    ] = ()

    # 1 to 4096 printable ASCII characters, checked like an API key (never echoed)
    _plain_token = field_validator("token")(_checked_key)
