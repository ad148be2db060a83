"""``python -m eval.longbench``: LongBench v1 run / score (see ``eval.longbench.cli``)."""

import sys

from .cli import main

sys.exit(main())
