"""``python -m icl_probes.label_flip``: see :mod:`icl_probes.label_flip.cli`."""

import sys

from .cli import main

sys.exit(main())
