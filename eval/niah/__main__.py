"""``python -m eval.niah``: the Needle-in-a-Haystack runner (see ``eval.niah.cli``)."""

import sys

from .cli import main

sys.exit(main())
