"""What the running environment's packages drifted from the test lock, or (``--write``) the lock
written anew from them.

The lock (requirements/test-lock.txt) holds pip constraints, one ``name==version`` a line, that
``make install`` applies. ``make test-latest`` and ``make lock`` run this script in a venv set up
at the newest versions pyproject.toml allows:

    python scripts/lock_drift.py requirements/test-lock.txt            # print the drift
    python scripts/lock_drift.py requirements/test-lock.txt --write    # write the lock anew

The project itself (installed editable) is left out; torch is written without its local label
(``2.13.0+cpu`` -> ``2.13.0``), so that the constraint admits the build the Makefile installed.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

HEADER = """\
# The test environment's versions: pip constraints that `make install` applies, so that a fresh
# clone gets the versions CI ran. Written by `make lock` from a venv at the newest versions that
# pyproject.toml allowed on {date} (Python {python}, {machine} Linux); `make test-latest` prints what
# has drifted since. Edit pyproject.toml, not this file, then run `make lock`.
"""
PROJECT = "elmokit"


def _name(raw: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", raw).lower()


def installed() -> dict[str, str]:
    """name -> version of every distribution in this environment but the project."""
    found = {}
    for dist in metadata.distributions():
        name = _name(dist.metadata["Name"])
        if name != PROJECT:
            found[name] = dist.version.split("+", 1)[0] if name == "torch" else dist.version
    return found


def read_lock(path: Path) -> dict[str, str]:
    """name -> version of a lock's ``name==version`` lines."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_name(name)] = version
    return pins


def drift(locked: dict[str, str], now: dict[str, str]) -> list[str]:
    """One line per package whose version differs, that is new, or that is gone."""
    lines = []
    for name in sorted(set(locked) | set(now)):
        old, new = locked.get(name), now.get(name)
        if old != new:
            lines.append(f"drift: {name}: {old or '(not locked)'} -> {new or '(not installed)'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lock", type=Path, help="the lock file (requirements/test-lock.txt)")
    parser.add_argument("--write", action="store_true", help="write the lock from this environment")
    args = parser.parse_args(argv)
    now = installed()
    if args.write:
        header = HEADER.format(
            date=datetime.date.today().isoformat(),
            python=platform.python_version(),
            machine=platform.machine(),
        )
        body = "".join(f"{name}=={version}\n" for name, version in sorted(now.items()))
        args.lock.parent.mkdir(parents=True, exist_ok=True)
        args.lock.write_text(header + body, encoding="utf-8")
        print(f"wrote {args.lock}: {len(now)} packages")
        return 0
    lines = drift(read_lock(args.lock), now)
    print("\n".join(lines) if lines else f"drift: none from {args.lock}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
