#!/usr/bin/env bash
# The README's test command: set up everything the suite needs on a fresh Debian machine, then
# run it. One line to call, from anywhere:   bash scripts/test.sh [pytest arguments]
#
#   1. system packages: redis-server, PostgreSQL's server binaries (initdb, pg_ctl), Chromium
#      and chromedriver, and g++ and cmake (llama-cpp-python builds from its sdist). As root, what is missing is apt-get installed (and an unprivileged
#      `ailease_pg` user made, since PostgreSQL refuses to run as root); not root and something
#      missing, the list of what to install is printed and the script exits 1.
#   2. .venv with the package and its dev tools (`pip install -q -e '.[dev]'`), and beside it
#      .venv-servers with the real model servers the conformance suite starts
#      (tests/realservers/requirements.txt: llama-cpp-python's server, LiteLLM's proxy).
#   3. .venv/bin/python -m pytest -n 7 "$@": seven pytest-xdist workers, each with its own
#      servers on free ports (tests/harness/xdist_groups.py says how tests are spread);
#      AI_LEASE_TEST_WORKERS=N for another number, 0 for one process.
# Every step prints the time it took. The tests never skip for a missing server: they fail.
# Python's bytecode is cached for the run (PYTHONDONTWRITEBYTECODE is unset; see below).
set -euo pipefail
cd "$(dirname "$0")/.."

# Bytecode is cached, in __pycache__ beside the sources (git ignores it). The suite starts over a
# thousand Python processes (every CLI command, worker, node and server), and pytest imports every
# test module in each of its workers: with PYTHONDONTWRITEBYTECODE set, as some CI images and
# containers set it, each of them would compile ai_lease and the tests again (0.1 s of CPU for a
# CLI command, 5 s for a worker's collection).
unset PYTHONDONTWRITEBYTECODE

step_started=0
step() { step_started=$SECONDS; echo "== $1" >&2; }
took() { echo "== $1: $((SECONDS - step_started)) s" >&2; }

# Debian keeps initdb/pg_ctl under /usr/lib/postgresql/<major>/bin, off PATH; the harness
# (tests/harness/pg_server.py) looks there too.
pg_initdb() { command -v initdb 2>/dev/null || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1; }

missing_packages() {
    command -v redis-server >/dev/null 2>&1 || echo redis-server
    [ -n "$(pg_initdb)" ] || echo postgresql
    [ -x /usr/bin/chromium ] || echo chromium
    [ -x /usr/bin/chromedriver ] || echo chromium-driver
    python3 -c 'import ensurepip, venv' 2>/dev/null || echo python3-venv
    # llama-cpp-python (the real-server suite) builds from its sdist with a C++ compiler and cmake
    command -v g++ >/dev/null 2>&1 || echo g++
    command -v cmake >/dev/null 2>&1 || echo cmake
}

step "system packages"
missing="$(missing_packages | tr '\n' ' ')"
missing="${missing% }"
if [ -n "$missing" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "the test suite needs these Debian packages, which are not installed: $missing" >&2
        echo "install them (as root: apt-get install -y $missing) and run this again" >&2
        exit 1
    fi
    echo "installing: $missing" >&2
    apt-get update -qq
    # shellcheck disable=SC2086  # one word per package
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
fi
if [ "$(id -u)" = 0 ] && ! id -u ailease_pg >/dev/null 2>&1; then
    useradd --system --no-create-home ailease_pg   # the harness runs PostgreSQL as this user
fi
redis-server --version
"$(pg_initdb)" --version
/usr/bin/chromium --version 2>/dev/null
/usr/bin/chromedriver --version
took "system packages"

# The two venvs install side by side (pip mostly waits on unpacking and the disk). llama-cpp-python
# builds from its sdist the first time (~14 min on 2 cores), then comes from pip's wheel cache
# (under a minute). A failed install of either fails this script: the suite needs both.
step ".venv-servers (the real model servers, tests/realservers/requirements.txt), in the background"
servers_log="$(mktemp)"
(
    [ -x .venv-servers/bin/python ] || python3 -m venv .venv-servers
    # --no-compile: the servers import a fraction of what they install (LiteLLM is thousands of
    # modules); those compile on first import instead, into the same __pycache__.
    .venv-servers/bin/pip install -q --no-compile -r tests/realservers/requirements.txt
) >"$servers_log" 2>&1 &
servers_pid=$!
servers_started=$SECONDS
trap 'kill "$servers_pid" 2>/dev/null || true; rm -f "$servers_log"' EXIT  # an early exit stops it

step ".venv (the package and its dev tools)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[dev]'
took ".venv"

# While the servers' venv installs: compile ai_lease/ and tests/, and let pytest rewrite the test
# modules' asserts once, so that the workers start from its cache rather than each doing it.
step "bytecode of ai_lease/ and tests/, while .venv-servers installs"
.venv/bin/python -m compileall -q -j 0 ai_lease tests >/dev/null
.venv/bin/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null
took "bytecode"

step ".venv-servers: waiting for it"
servers_status=0
wait "$servers_pid" || servers_status=$?
cat "$servers_log" >&2
if [ "$servers_status" != 0 ]; then
    echo "installing tests/realservers/requirements.txt into .venv-servers failed ($servers_status)" >&2
    exit 1
fi
echo "== .venv-servers: $((SECONDS - servers_started)) s" >&2

# Seven pytest-xdist workers by default (AI_LEASE_TEST_WORKERS=N for N, 0 for one process): the
# suite mostly waits on real processes, leases and streams, so seven keep two cores busy without
# starving its timing tests. How tests are spread: tests/harness/xdist_groups.py.
step "pytest $*"
status=0
.venv/bin/python -m pytest -n "${AI_LEASE_TEST_WORKERS:-7}" "$@" || status=$?
took "pytest"
exit "$status"
