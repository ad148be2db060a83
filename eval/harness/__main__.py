"""``python -m eval.harness``: the same command as ``gemfilter-lm-eval``."""

import sys

from .cli import main

sys.exit(main())
