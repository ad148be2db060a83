"""``python -m eval.ruler``: RULER prepare / run / score (see ``eval.ruler.cli``)."""

import sys

from .cli import main

sys.exit(main())
