"""``python -m icl_probes.looped``: see ``icl_probes.looped.cli``."""

import sys

from icl_probes.looped.cli import main

if __name__ == "__main__":
    sys.exit(main())
