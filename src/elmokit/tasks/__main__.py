"""``python -m elmokit.tasks ner|pos|sentiment --train F --dev F --test F --out DIR ...``"""

import sys

from .cli import main

__all__: list[str] = []

sys.exit(main())
