"""``python -m feature_probes.midpoint_mixup``: see ``cli.py``."""

from feature_probes.midpoint_mixup.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
