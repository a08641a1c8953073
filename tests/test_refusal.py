"""Refusal codes are one enum: the Lua scripts, the pure rules and the errors share it."""

from __future__ import annotations

import inspect
import re

import pytest

from ai_lease.errors import FencingRejected, LeaseLost
from ai_lease.lease.base import Fence
from ai_lease.refusal import MESSAGES, RENEWAL_REFUSALS, WRITE_REFUSALS, Refusal
from ai_lease.stores.redis import admin_scripts as redis_admin_scripts
from ai_lease.stores.redis import prelude as redis_prelude
from ai_lease.stores.redis import scripts as redis_scripts

# The first element of a script's reply table that is a kind of answer, not a refusal.
_REPLY_KINDS = {"ok", "written", "acquired", "following", "finished", "conflict", "rejected"}


_MODULES = (redis_scripts, redis_admin_scripts)  # the job scripts, the lifecycle scripts


def _scripts() -> dict[str, str]:
    return {
        name: text
        for module in _MODULES
        for name, text in vars(module).items()
        if name.isupper()
        and not name.startswith("_")
        and isinstance(text, str)
        and "\n" in text
        and not hasattr(redis_prelude, name)  # the prelude each one starts with, imported
    }


def _returned_codes(text: str) -> set[str]:
    """Every refusal code a script's text can return: ``{'rejected', code, …}``, a
    ``why = code`` chosen for one, and a reply table led by a code (RENEW)."""
    codes = set(re.findall(r"\{'rejected', '([a-z_]+)'", text))
    codes |= set(re.findall(r"\bwhy = '([a-z_]+)'", text))
    codes |= set(re.findall(r"return \{'([a-z_]+)'", text)) - _REPLY_KINDS
    return codes


def _header_codes(name: str) -> set[str]:
    """The codes a script's header comment lists (``# refusals (…Refusal): a, b, …``)."""
    source = "\n".join(inspect.getsource(module) for module in _MODULES)
    header = re.search(rf"((?:^#.*\n)+){name} = ", source, re.MULTILINE)
    assert header is not None, f"{name} has no header comment"
    listed = re.search(r"# refusals \([\w.]+\): ((?:[a-z_]+,?\s*(?:# )?)+)", header[1])
    return set() if listed is None else set(re.findall(r"[a-z_]+", listed[1]))


def test_scripts_are_found() -> None:
    """The parser sees the scripts that refuse (a guard against a parser that finds none)."""
    found = {name: _returned_codes(text) for name, text in _scripts().items()}
    assert found["RENEW"] == {r.value for r in RENEWAL_REFUSALS}
    assert found["FINISH"] == {r.value for r in WRITE_REFUSALS}


@pytest.mark.parametrize("name", sorted(_scripts()))
def test_every_code_a_script_returns_is_a_refusal(name: str) -> None:
    """Each code a Lua script can return is a Refusal member, listed in its header."""
    returned = _returned_codes(_scripts()[name])
    members = {r.value for r in Refusal}
    assert returned <= members, f"{name} returns codes the enum lacks: {returned - members}"
    assert returned == _header_codes(name), f"{name}'s header does not list what it returns"


def test_every_refusal_has_a_message() -> None:
    """One message per member, none blank, none shared: the English text is never a code."""
    assert set(MESSAGES) == set(Refusal)
    assert all(text.strip() for text in MESSAGES.values())
    assert len(set(MESSAGES.values())) == len(MESSAGES)
    assert all(r.message == MESSAGES[r] for r in Refusal)


def test_every_refusal_is_produced_somewhere() -> None:
    """Each member is a renewal's or a write's refusal (no dead codes)."""
    assert set(RENEWAL_REFUSALS) | set(WRITE_REFUSALS) == set(Refusal)


def test_fencing_rejected_carries_the_refusal_and_the_fences() -> None:
    """FencingRejected keeps the enum member, its code and both fences; its text names the
    fences and the refusal's message."""
    held, current = Fence("job-1", "a", 11), Fence("job-1", "b", 12)
    exc = FencingRejected("job-1", held, current, Refusal.NEWER_OWNER)
    assert exc.refusal is Refusal.NEWER_OWNER and exc.code == "newer_owner"
    assert exc.held is held and exc.current is current
    assert str(exc) == (
        "job 'job-1': fence token 11 of 'a' is stale, the store holds token 12 of 'b' "
        "(a newer owner took the job over): result not written"
    )
    assert "holds none" in str(FencingRejected("job-1", held, None, Refusal.MISSING))


def test_lease_lost_carries_the_refusal() -> None:
    """A refused renewal's LeaseLost names the code and the message; a local one has none."""
    fence = Fence("job-1", "a", 11)
    lost = LeaseLost.refused(fence, Refusal.NOT_OWNER)
    assert lost.refusal is Refusal.NOT_OWNER and lost.code == "not_owner"
    assert lost.held == fence
    assert "(not_owner)" in str(lost) and Refusal.NOT_OWNER.message in str(lost)
    local = LeaseLost("job-1", "self-fenced", fence)
    assert local.refusal is None and local.code == "local" and "(token 11)" in str(local)


def test_fence_reads_well() -> None:
    """A fence prints as its pair and reprs with its fields."""
    fence = Fence("job-1", "a", 11)
    assert str(fence) == "token 11 of 'a'"
    assert repr(fence) == "Fence(key='job-1', owner_id='a', token=11)"
