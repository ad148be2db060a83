"""``python -m feature_probes.interval``: see ``cli.py``."""

from feature_probes.interval.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
