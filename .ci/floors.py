"""Print each runtime dependency of pyproject.toml pinned at its floor (``>=X`` -> ``==X``).

    python3 .ci/floors.py [PYPROJECT] [--extra NAME ...]

With ``--extra``, the dependencies of those optional extras too (``--extra ui``: what
``pip install 'ai_lease[ui]'`` adds). Used by .ci/run to install the oldest versions the
project claims to support, so a floor that does not work fails CI instead of a user's first
transient error.

psycopg's ``[binary]`` extra (a wheel with libpq built in) is left out at the floor: those
wheels are published for fewer releases than psycopg itself, and the floor runs psycopg's
pure-Python build on the system's libpq (the PostgreSQL server package brings it).
"""

import argparse
import re
import sys
import tomllib
from pathlib import Path

parser = argparse.ArgumentParser(prog="floors.py")
parser.add_argument("pyproject", nargs="?", default="pyproject.toml", type=Path)
parser.add_argument("--extra", action="append", default=[])
args = parser.parse_args()
project = tomllib.loads(args.pyproject.read_text())["project"]
requirements = list(project["dependencies"])
for extra in args.extra:
    requirements += project["optional-dependencies"][extra]
for requirement in requirements:
    match = re.match(r"^([A-Za-z0-9_.\-\[\]]+)\s*[^>]*>=\s*([^,;\s]+)", requirement)
    if match is None:
        sys.exit(f"dependency without a >= floor: {requirement!r}")
    name = match.group(1).replace("psycopg[binary]", "psycopg")
    print(f"{name}=={match.group(2)}")
