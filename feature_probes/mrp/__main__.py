"""``python -m feature_probes.mrp``: see ``cli.py``."""

from feature_probes.mrp.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
