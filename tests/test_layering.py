"""Layering: the library never imports ``eval``, and no library module is part of an import cycle.

The graph is read from the source with ``ast`` (no module is imported), counting every import
statement, module level or inside a function: a lazy import still ties two modules together.
``from pkg import name`` points at ``pkg.name`` when that is a module, else at ``pkg`` itself.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "gemfilter"


def module_files(package: str = PACKAGE) -> dict:
    """dotted module name -> file, for every .py file of the package."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: dict) -> set:
    """Every module named by an import statement in ``path`` (absolute, dotted)."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]  # the package relative imports start from
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return found


def graph() -> dict:
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(edges: dict) -> list:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue  # outside the package
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_library_never_imports_eval():
    bad = {
        name: sorted(t for t in targets if t == "eval" or t.startswith("eval.")) for name, targets in graph().items()
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_no_library_module_takes_part_in_an_import_cycle():
    assert cycles(graph()) == []


def test_the_checker_sees_lazy_relative_and_package_imports(tmp_path):
    """The checker itself: a cycle through a function-level import and a package __init__ is found."""
    edges = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}, "p.c": {"p.a"}}
    assert cycles(edges) == [["p", "p.a", "p.b"]]
    src = tmp_path / "gemfilter" / "methods"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("from . import cache\n")
    (src / "cache.py").write_text("def f():\n    from . import register\n    from ..selection import x\n")
    modules = {
        "gemfilter.methods": src / "__init__.py",
        "gemfilter.methods.cache": src / "cache.py",
        "gemfilter.selection": None,
    }
    assert imports_of("gemfilter.methods", src / "__init__.py", modules) == {"gemfilter.methods.cache"}
    assert imports_of("gemfilter.methods.cache", src / "cache.py", modules) == {
        "gemfilter.methods",
        "gemfilter.selection",
    }


#: The lab: command lines, benchmarks, inspection, serving, result files. Everything else in ``gemfilter`` is the
#: plugin's core (apply, attention, banded, methods, selection, score, models, compat, layers, conversation,
#: measure, extras), which imports nothing of the lab.
LAB = ("gemfilter.lab",)
#: The shared toolkit (result files, options, the haystack, entry points, the engine client): used by the lab and
#: by ``eval/``, it imports only the core.
TOOLKIT = ("gemfilter.toolkit",)
#: command-line modules: what parses arguments and prints for a person
CLI = (
    "gemfilter.lab.cli",
    "gemfilter.toolkit.options",
    "gemfilter.lab.serve.cli",
    "gemfilter.lab.serve.bench",
    "gemfilter.lab.serve.turns",
    "gemfilter.lab.serve.burst",
    "gemfilter.lab.bench.report",
    "gemfilter.lab.bench.decode",
    "gemfilter.lab.bench.conversation",
    "gemfilter.lab.inspection.report",
)


def in_group(name: str, group) -> bool:
    return any(name == g or name.startswith(g + ".") for g in group)


def core_modules(edges) -> list:
    return [name for name in edges if name != PACKAGE and not in_group(name, LAB + TOOLKIT)]


def test_the_core_imports_nothing_of_the_lab():
    edges = graph()
    assert len(core_modules(edges)) >= 12
    found = {(src, dst) for src in core_modules(edges) for dst in edges[src] if in_group(dst, LAB)}
    assert not found, f"core modules import the lab: {sorted(found)}"


def test_the_core_imports_nothing_of_the_toolkit():
    edges = graph()
    found = {(src, dst) for src in core_modules(edges) for dst in edges[src] if in_group(dst, TOOLKIT)}
    assert not found, f"core modules import the toolkit: {sorted(found)}"


def test_the_toolkit_imports_only_the_core():
    edges = graph()
    toolkit = [name for name in edges if in_group(name, TOOLKIT)]
    assert len(toolkit) >= 9
    found = {(src, dst) for src in toolkit for dst in edges[src] if in_group(dst, LAB) or in_group(dst, ("eval",))}
    assert not found, f"toolkit modules import the lab or eval: {sorted(found)}"


def test_eval_and_the_probes_import_nothing_of_the_lab():
    """The benchmarks and the probes use the core and the toolkit, never the lab's commands, benchmarks or server."""
    wings = ("eval", "icl_probes", "feature_probes")
    modules = {**module_files(), **{k: v for w in wings for k, v in module_files(w).items()}}
    found = sorted(
        (name, dst)
        for name, path in modules.items()
        if in_group(name, wings)
        for dst in imports_of(name, path, modules)
        if in_group(dst, LAB)
    )
    assert found == []


def test_the_package_s_public_api_is_the_core_s():
    """``import gemfilter`` loads the core only: the package ``__init__`` imports no lab module."""
    assert not [d for d in graph()[PACKAGE] if in_group(d, LAB)]


def test_only_command_modules_import_command_modules():
    """The proxy, the engine path, the selector and every other library module are used by commands, never
    the reverse (toolkit/serving/engine.py, for instance, must not import serve/cli.py for its tokenizer check)."""
    found = {
        (src, dst)
        for src, targets in graph().items()
        if not in_group(src, CLI)
        for dst in targets
        if in_group(dst, CLI)
    }
    assert not found, f"library modules import command-line modules: {sorted(found)}"


def test_no_benchmark_imports_another_benchmark_s_report():
    benches = ("eval.niah", "eval.ruler", "eval.longbench", "eval.harness", "eval.scbench")
    modules = module_files("eval")
    edges = {name: imports_of(name, path, modules) for name, path in modules.items()}
    found = {
        (src, dst)
        for src, targets in edges.items()
        for dst in targets
        for a in benches
        for b in benches
        if a != b and in_group(src, (a,)) and in_group(dst, (b + ".report",))
    }
    assert not found, f"a benchmark imports another's report: {sorted(found)}"


def probe_modules() -> dict:
    """The probes' modules, plus the plugin's so that ``from gemfilter.toolkit import io`` resolves to
    ``gemfilter.toolkit.io``."""
    return {**module_files(), **module_files("icl_probes"), **module_files("feature_probes")}


def test_no_probe_imports_the_plugin_s_file_module():
    """The probes write their files through ``icl_probes.io``; ``gemfilter.toolkit.io`` serves the plugin and the
    evals."""
    modules = probe_modules()
    found = sorted(
        f"{name} imports gemfilter.toolkit.io"
        for name, path in modules.items()
        if not in_group(name, (PACKAGE,))
        if "gemfilter.toolkit.io" in imports_of(name, path, modules)
    )
    assert found == []


def test_the_probe_check_sees_every_spelling_of_the_import(tmp_path):
    modules = probe_modules()
    for source in (
        "from gemfilter.toolkit import io\n",
        "import gemfilter.toolkit.io\n",
        "def f():\n    from gemfilter.toolkit.io import x\n",
    ):
        (tmp_path / "m.py").write_text(source)
        assert "gemfilter.toolkit.io" in imports_of("icl_probes.m", tmp_path / "m.py", modules), source
