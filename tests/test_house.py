"""House rules read from the source with ``ast``: no function over 80 lines; every command that appends result rows
uses the one row loop; the eval runners parse no method spec (their commands hand them the run plan)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("gemfilter", "eval", "icl_probes", "feature_probes")


def sources():
    for package in CODE:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_no_function_is_over_80_lines():
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sources()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80
    ]
    assert long == []


def calls(path: Path) -> set:
    """The names of every function called in ``path`` (``f(...)`` and ``x.f(...)``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            out.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return out


def test_every_command_that_appends_rows_does_it_on_the_one_loop():
    """A module that appends result rows (``append_jsonl`` / ``append_row``) computes its units with the loop's
    ``compute`` (or ``every_row``, on it): the benchmarks, the lab's benches and the probes (which write through
    ``icl_probes.io``); the file helpers are where appending is defined."""
    appenders = [
        p for p in sources() if {"append_jsonl", "append_row"} & calls(p) and p.name not in ("io.py", "rundir.py")
    ]
    assert appenders, "the search found nothing: it is looking in the wrong place"
    assert [str(p.relative_to(ROOT)) for p in appenders if not {"compute", "every_row"} & calls(p)] == []


def test_the_eval_runners_parse_no_method_spec():
    for path in sorted((ROOT / "eval").glob("*/runner.py")) + [ROOT / "eval" / "runner.py"]:
        assert not {"parse_spec", "parse_specs", "parse_method"} & calls(path), path
