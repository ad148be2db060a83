"""Command entry points: a missing optional dependency (``gemfilter.extras``) or Ctrl-C ends a command with one line."""

from __future__ import annotations

import functools
import sys

from gemfilter.extras import DIST, EXTRAS, MissingExtra, missing_modules, require  # noqa: F401 (re-exported)


class ErrorExit(SystemExit):
    """End a command with one ``error: MESSAGE`` line on stderr (printed by :func:`command`) and exit 2.

    A SystemExit, so that it leaves any depth of the command at once; ``str()`` is the line."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return f"error: {self.message}"


def command(*extras: str, name: str | None = None):
    """Decorate a command's ``main(argv=None) -> int``.

    Before it runs, the named extras are checked (not for ``-h``/``--help``, which must always teach).
    A :class:`MissingExtra` raised anywhere inside ends the command with one ``error:`` line and
    exit 2 (returned); an :class:`ErrorExit` prints its line and exits 2 (raised); Ctrl-C ends it with
    one line and exit 130, the shell's convention for SIGINT.
    """

    def wrap(main):
        prog = name or main.__module__

        @functools.wraps(main)
        def run(argv=None) -> int:
            args = sys.argv[1:] if argv is None else list(argv)
            try:
                if not {"-h", "--help"} & set(args):
                    for extra in extras:
                        require(extra, prog)
                return main(argv)
            except ErrorExit as err:
                if not getattr(err, "printed", False):  # once, where a command runs another (gemfilter bench)
                    print(err, file=sys.stderr)
                    err.printed = True
                raise
            except MissingExtra as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                _close_progress_bars()
                print(f"{prog}: interrupted", file=sys.stderr)
                return 130

        return run

    return wrap


def _close_progress_bars() -> None:
    """Close the progress bars an interrupted command left open, so its last line starts on a line of its own
    (a bar redraws itself without a newline until it is closed)."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a core dependency
        return
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
