"""``python -m elmokit.cli`` (as ``torchrun -m elmokit.cli`` runs it): the ``elmokit`` command."""

import sys

from .commands import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
