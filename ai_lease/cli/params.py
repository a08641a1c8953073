"""Command-line parameter types shared by the commands."""

from __future__ import annotations

from typing import Any

import click

from ai_lease.errors import JobSpecError

__all__ = ["JOB_KEY"]


class JobKeyType(click.ParamType):  # type: ignore[type-arg,unused-ignore]  # generic in click 8.2
    """A job key, checked like every key (:func:`ai_lease.job.validate_key`) before any store
    is opened: a bad one is a usage error, exit 2."""

    name = "key"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from ai_lease.job import validate_key

        try:
            return validate_key(value)
        except JobSpecError as exc:
            self.fail(str(exc), param, ctx)


JOB_KEY = JobKeyType()
