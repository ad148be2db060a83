"""The documents hold: every relative link resolves, and every command in a fenced shell block exists.

Scanned: README.md, docs/*.md and the probes' READMEs. A link ``[text](path#anchor)`` must name a file or
folder of the checkout and, with an anchor into a markdown file, one of its headings (GitHub's slugs).
A shell line (a ```bash or ```sh block) is checked by its program: a console script of
pyproject.toml or ``python -m MODULE`` (also behind ``torchrun`` / ``accelerate launch``) must run its
``--help`` (the subcommand's when one is named) with exit status 0; ``make T`` must name a Makefile
target. Engines and system tools named in EXTERNAL are only recognised, not run. A document cited by path in
the code or the documents (``docs/evals.md``, ``feature_probes/mrp/README.md``) must exist, and a section named
after it in quotes must be one of its headings.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import load_toml

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("*_probes/*/README.md"))]
#: programs that are not this project's: recognised, never run
EXTERNAL = {
    "curl",
    "pip",
    "git",
    "cd",
    "cp",
    "mkdir",
    "bash",
    "for",
    "do",
    "done",
    "export",
    "ls",
    "cat",
    "nvidia-smi",
    "hf",
    "vllm",
}  # the Hub's command line (publishing the custom_generate repo) and vLLM's
#: python modules of other projects that the docs start (the serving engine)
EXTERNAL_MODULES = ("vllm.",)
SCRIPTS = load_toml(REPO / "pyproject.toml")["project"]["scripts"]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set:
    heads = [
        line.lstrip("#").strip()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("#") and not line.startswith("#!")
    ]
    return {_slug(h) for h in heads}


def _links():
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)  # code is not links
        for match in LINK.finditer(text):
            target = match[1] or match[2]
            if not re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                yield doc, target


@pytest.mark.parametrize(
    "doc,target", list(_links()), ids=lambda v: str(v.relative_to(REPO)) if isinstance(v, Path) else v
)
def test_relative_link_resolves(doc, target):
    path, _, anchor = target.partition("#")
    dest = (doc.parent / path).resolve() if path else doc
    assert dest.exists(), f"{doc.relative_to(REPO)} links to {target}, which does not exist"
    if anchor and dest.suffix == ".md":
        assert anchor in _anchors(dest), f"{doc.relative_to(REPO)} links to {target}: no such heading in {dest.name}"


def _shell_lines():
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S):
            if lang not in ("bash", "sh"):
                continue
            pending = ""
            for line in body.replace("\\\n", " ").splitlines():
                line = (pending + " " + line).strip() if pending else line.split(" #")[0].strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    shlex.split(line)
                except ValueError:  # a quoted argument goes on over the next lines (curl -d '{...}')
                    pending = line
                    continue
                pending = ""
                yield doc, line


def _program(line: str):
    """(kind, name, first argument) of a shell line: kind 'script', 'module', 'make' or 'external'."""
    words = shlex.split(line)
    while words and re.match(r"^[A-Za-z_]+=", words[0]):  # VAR=value prefixes
        words.pop(0)
    while words and words[0] in ("/usr/bin/time", "time", "nice") or (words and re.match(r"^-", words[0])):
        words.pop(0)
        if words and re.match(r"^-?\d+$", words[0]):  # nice -n 15
            words.pop(0)
    name = Path(words[0]).name
    if name in ("torchrun", "accelerate"):
        words = words[words.index("-m") :] if "-m" in words else words
        name = "python"
    if name.startswith("python") and "-m" in words:
        words = words[words.index("-m") :]
        name = words.pop(1)
    sub = words[1] if len(words) > 1 and not words[1].startswith("-") else None  # a subcommand, or a value
    if words[0] == "-m":
        return "module", name, sub
    if name in SCRIPTS:
        return "script", name, sub
    if name == "make":
        return "make", words[1] if len(words) > 1 else "", None
    return "external", name, None


def _run_help(kind: str, name: str, sub) -> tuple:
    """Run ``--help`` in this process; returns (exit status, output)."""
    argv = ([sub] if sub and not sub.startswith("-") and "/" not in sub and "." not in sub else []) + ["--help"]
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            if kind == "script":
                module, func = SCRIPTS[name].split(":")
                __import__(module)
                code = sys.modules[module].__dict__[func](argv) or 0
            else:
                old = sys.argv
                sys.argv = [name, *argv]
                try:
                    runpy.run_module(name, run_name="__main__", alter_sys=False)
                finally:
                    sys.argv = old
        except SystemExit as exit_:
            code = exit_.code or 0
    return code, out.getvalue()


COMMANDS = sorted({(_program(line)) for _, line in _shell_lines()}, key=str)


def _repo_script(line: str) -> bool:
    """The line runs a program shipped in this repo (scripts/gpu_check.sh): an executable file whose --help
    teaches."""
    words = [w for w in shlex.split(line) if not re.match(r"^[A-Za-z_]+=", w)]
    path = REPO / words[0]
    if not (path.is_file() and os.access(path, os.X_OK)):
        return False
    out = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=30)
    return out.returncode == 0 and "Usage" in out.stdout


def test_every_shell_line_names_a_known_program():
    unknown = [
        (doc.relative_to(REPO), line)
        for doc, line in _shell_lines()
        if _program(line)[0] == "external" and _program(line)[1] not in EXTERNAL and not _repo_script(line)
    ]
    assert not unknown, f"shell lines naming no console script, module, make target or known tool: {unknown}"


@pytest.mark.parametrize(
    "kind,name,sub",
    [c for c in COMMANDS if c[0] in ("script", "module") and not c[1].startswith(EXTERNAL_MODULES)],
    ids=str,
)
def test_documented_command_runs_its_help(kind, name, sub):
    code, out = _run_help(kind, name, sub)
    assert code == 0, f"{name} {sub or ''} --help exited {code}:\n{out[-2000:]}"
    assert "usage:" in out


def test_documented_make_targets_exist():
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), flags=re.M))
    missing = {name for kind, name, _ in COMMANDS if kind == "make"} - targets
    assert not missing, f"documented make targets missing from the Makefile: {missing}"


#: a document cited by path from code or prose: the README, a probe's README, or a page under docs/
DOC_PATH = r"[\w./-]*(?:README|docs/[\w.-]+)\.md"
#: a cited section: the document's path, then the section's name in quotes (``docs/evals.md, "Choosing ..."``)
CITED_SECTION = re.compile(rf"({DOC_PATH})(?:'s)?,?\s+(?:section\s+)?[\"“]([^\"”\n]+)[\"”]")
CITING = [
    p
    for folder in ("gemfilter", "eval", "icl_probes", "feature_probes", "tests")
    for p in sorted((REPO / folder).rglob("*.py"))
    if p != Path(__file__).resolve()
] + DOCS


def _headings(path: Path) -> list:
    return [
        re.sub(r"[`*]", "", line.lstrip("#").strip())
        for line in path.read_text(encoding="utf-8").splitlines()
        if re.match(r"#{1,6} ", line)
    ]


def citation_problems(text: str, source: Path) -> list:
    """Each cited document (``docs/x.md``, ``README.md``, ``pkg/README.md``) that does not exist, and each quoted
    section that is not a heading of it. A name may shorten a heading: "Choices" for "Choices (the paper ...)"."""
    problems = []
    for match in re.finditer(DOC_PATH, text):
        path = match[0]
        if not path.startswith("/") and not (REPO / path).exists() and not (source.parent / path).exists():
            problems.append(f"{path}: no such file")
    for path, section in CITED_SECTION.findall(text):
        doc = REPO / path if (REPO / path).exists() else source.parent / path
        if not doc.exists():
            continue  # reported above
        name = re.sub(r"[`*]", "", section).strip()
        if not any(h == name or re.match(re.escape(name) + r"[ :(]", h) for h in _headings(doc)):
            problems.append(f'{path}, "{section}": no such section')
    return problems


def test_every_cited_document_and_section_exists():
    """Docstrings, comments and documents that name a document, or a section of one, name what is there."""
    problems = [
        f"{source.relative_to(REPO)}: {problem}"
        for source in CITING
        for problem in citation_problems(source.read_text(encoding="utf-8"), source)
    ]
    assert not problems, "cited documents or sections that are not there:\n" + "\n".join(problems)


def test_the_citation_check_finds_a_moved_section():
    here = REPO / "gemfilter" / "layers.py"
    assert citation_problems('see docs/evals.md, "Choosing the embedded model\'s layer".', here) == []
    assert citation_problems('as icl_probes/label_flip/README.md "Deviations and choices" says', here) == []
    assert citation_problems('feature_probes/mrp/README.md, "Choices"', here) == []  # a heading's first words
    assert citation_problems('README.md, "Choosing the embedded model\'s layer"', here) == [
        'README.md, "Choosing the embedded model\'s layer": no such section'
    ]
    assert citation_problems("measured in docs/nowhere.md", here) == ["docs/nowhere.md: no such file"]


def _lock() -> dict:
    """requirements.lock as {normalized name: version}."""
    pins = re.findall(r"^([\w.-]+)==(\S+)", (REPO / "requirements.lock").read_text(), flags=re.M)
    return {re.sub(r"[-_.]+", "_", name.lower()): version for name, version in pins}


def _ci_row(job: str) -> str:
    """The row of docs/setup.md's CI table for ``job`` (its first cell, without backticks)."""
    rows = [
        line
        for line in (REPO / "docs" / "setup.md").read_text(encoding="utf-8").splitlines()
        if line.startswith(f"| `{job}` |")
    ]
    assert len(rows) == 1, f"docs/setup.md has {len(rows)} CI table rows for {job}"
    return rows[0]


def test_setup_md_states_the_pins_of_the_floor_job():
    """The floor job's pins, as ``.ci/versions floor`` computes them from pyproject.toml, plus the lock's torch."""
    script = (REPO / ".ci" / "versions").read_text()
    code = re.search(r"\$mode\" = floor \]; then.*?<<'PY'\n(.*?)\nPY\n", script, flags=re.S)[1]
    floor = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    row = _ci_row("PYTHON=python3.10 .ci/versions floor")
    assert set(re.findall(r"`([\w-]+==[^`]+)`", row)) == {*floor.stdout.split(), f"torch=={_lock()['torch']}"}


def test_setup_md_states_the_lock_s_versions():
    """The ``make test`` row's versions are the lock's, and the torch every job takes is the lock's."""
    lock = _lock()
    stated = re.findall(r"([a-z][\w-]*) (\d+(?:\.\d+)+)", _ci_row("make test").split("the lock:")[1])
    assert len(stated) >= 5 and {name: lock.get(re.sub(r"[-_.]+", "_", name)) for name, _ in stated} == dict(stated)
    text = (REPO / "docs" / "setup.md").read_text(encoding="utf-8")
    assert f"**torch** is {lock['torch']} in every job" in text
