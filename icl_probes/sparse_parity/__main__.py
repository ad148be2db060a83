"""``python -m icl_probes.sparse_parity``: see :mod:`icl_probes.sparse_parity.cli`."""

import sys

from .cli import main

sys.exit(main())
