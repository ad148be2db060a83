"""``python -m feature_probes.parity``: see ``cli.py``."""

from feature_probes.parity.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
