"""The install: a lock that resolves off this machine, extras in step with the code, a light ``import gemfilter``.

The wheel itself (core dependencies only, in a fresh venv) is smoke-tested by ``.ci/wheel``.
"""

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from tiny_models import load_toml

from gemfilter.toolkit import entry

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
PYPROJECT = load_toml(ROOT / "pyproject.toml")
META_EXTRAS = {"all", "gpu", "dev"}  # extras of extras, CUDA kernels, test tools: no command needs them


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version.strip()
    return pins


def top_level(dist: str) -> frozenset:
    """The top-level modules an installed distribution's files hold (read from its RECORD)."""
    files = md.distribution(dist).files or ()
    return frozenset(
        f.parts[0].removesuffix(".py")
        for f in files
        if f.parts and not f.parts[0].endswith((".dist-info", ".data")) and f.parts[0] != ".."
    )


def test_lock_has_no_local_version_labels():
    """A local label (2.13.0+cpu) exists only in this machine's wheel folder; no registry serves it."""
    labelled = [f"{n}=={v}" for n, v in lock_pins().items() if "+" in v]
    assert not labelled, f"requirements.lock pins local version labels {labelled}; `make lock` strips them"


def test_installed_torch_is_the_locked_release():
    """``torch==2.13.0`` admits the local CPU build here (PEP 440 ignores the label) and nothing else."""
    import torch

    assert Version(torch.__version__).public == lock_pins()["torch"]


def test_extras_match_the_modules_commands_check():
    """pyproject's extras and gemfilter.extras.EXTRAS name the same extras, each module's distribution is in
    its extra, and ``all`` carries every extra."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(extras) - META_EXTRAS == set(entry.EXTRAS)
    for extra, (modules, _) in entry.EXTRAS.items():
        names = sorted(Requirement(r).name for r in extras[extra])
        installed = {top_level(name) for name in names}
        for module in modules:
            assert any(module in tops for tops in installed), (
                f"extra {extra!r} lists {names}, none of which installs module {module!r}"
            )
    all_extras = Requirement(extras["all"][0]).extras
    assert all_extras == set(entry.EXTRAS)
    core = {Requirement(r).name for r in PYPROJECT["project"]["dependencies"]}
    assert core == {"torch", "transformers", "accelerate", "safetensors", "tqdm"}


def test_import_gemfilter_loads_no_extra():
    code = (
        "import sys, gemfilter, gemfilter.lab.cli, gemfilter.lab.serve.cli; "
        "print(','.join(m for m in ('matplotlib', 'nltk', 'lm_eval', 'datasets', 'sklearn', 'rouge_score', "
        "'wonderwords', 'gguf', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "", f"import gemfilter loaded {out.stdout.strip()}"


@pytest.fixture
def fake_extra(monkeypatch):
    monkeypatch.setitem(entry.EXTRAS, "fake", (("gemfilter_no_such_module",), "a fake feature"))


def test_command_names_the_missing_extra_in_one_line(fake_extra, capsys):
    ran = []

    @entry.command("fake", name="tool")
    def main(argv=None):
        ran.append(argv)
        return 0

    assert main(["--out", "x"]) == 2 and not ran
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: tool needs the 'fake' extra (module 'gemfilter_no_such_module' is not installed): "
        "pip install 'gemfilter-lab[fake]'"
    ]
    assert main(["--help"]) == 0 and ran == [["--help"]]  # help teaches even without the extra


def test_command_reports_a_missing_extra_raised_inside_and_ctrl_c(fake_extra, capsys):
    @entry.command(name="tool")
    def needs_it(argv=None):
        entry.require("fake")

    @entry.command(name="tool")
    def interrupted(argv=None):
        raise KeyboardInterrupt

    assert needs_it([]) == 2
    assert re.fullmatch(r"error: a fake feature needs the 'fake' extra .*\n", capsys.readouterr().err)
    assert interrupted([]) == 130
    assert capsys.readouterr().err == "tool: interrupted\n"


def test_require_refuses_an_unknown_extra():
    with pytest.raises(ValueError, match="unknown extra 'nosuch'; allowed: embedded, plots"):
        entry.require("nosuch")


def sigint_as_from_a_terminal():
    """In the child before exec: SIGINT delivered and handled by default, as in a terminal. A background job
    (CI, ``make test &``) starts with SIGINT ignored, and a test run may leave it blocked; both are inherited."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_ends_a_command_with_one_line_and_exit_130(tmp_path):
    """A real command interrupted mid-run (SIGINT, as Ctrl-C sends it): one line, exit 130, no traceback."""
    import signal
    import threading
    import time

    # Adam steps on small tensors: the interpreter runs Python between short torch calls, so SIGINT is acted
    # on at once (inside one long native call it would wait for the call to return).
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "icl_probes.looped",
            "train",
            "--steps",
            "100000",
            "--threads",
            "1",
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_from_a_terminal,
    )
    err = []
    reader = threading.Thread(target=lambda: err.extend(iter(lambda: proc.stderr.read(1), "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 180
    while not err and proc.poll() is None and time.monotonic() < deadline:  # its progress bar: inside the run
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    reader.join(timeout=10)
    err = "".join(err)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and err.splitlines()[-1] == "python -m icl_probes.looped: interrupted", err[-2000:]
