"""``python -m icl_probes.modular``: see ``cli.py``."""

from icl_probes.modular.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
