"""``python -m eval.scbench``: SCBench run / report (see ``eval.scbench.cli``)."""

import sys

from .cli import main

sys.exit(main())
