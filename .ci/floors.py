"""Print each runtime dependency of pyproject.toml pinned at its declared floor (``>=X`` -> ``==X``).

Used by .ci/run to install the oldest versions the project claims to support, so a floor that
does not work fails CI instead of a user's first transient error.
"""

import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml").read_text())
for requirement in project["project"]["dependencies"]:
    match = re.match(r"^([A-Za-z0-9_.\-\[\]]+)\s*[^>]*>=\s*([^,;\s]+)", requirement)
    if match is None:
        sys.exit(f"dependency without a >= floor: {requirement!r}")
    print(f"{match.group(1)}=={match.group(2)}")
