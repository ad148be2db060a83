"""GemFilter as a transformers ``custom_generate`` method (gemfilter/hub, written out by ``gemfilter export-hub``).

``model.generate(..., custom_generate=FOLDER, trust_remote_code=True, gemfilter_method=SPEC)`` loads the folder's
``custom_generate/generate.py`` through transformers' own loader and must equal ``gemfilter.generate`` with that
spec, token for token, on the tiny models; ``generate`` without it is untouched.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import BUILDERS, FILTER_LAYER, DotTokenizer

import gemfilter
from gemfilter.lab.cli import main
from gemfilter.methods import parse_method

ROOT = Path(__file__).resolve().parents[1]
HUB = ROOT / "gemfilter" / "hub"
FILES = ("README.md", "custom_generate/generate.py", "custom_generate/requirements.txt")


def prompt(n=40, batch=1):
    torch.manual_seed(1)
    return {"input_ids": torch.randint(3, 90, (batch, n)), "attention_mask": torch.ones(batch, n, dtype=torch.long)}


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_custom_generate_equals_gemfilter_generate(family):
    model = BUILDERS[family]()
    spec = f"gemfilter:k=12,layer={FILTER_LAYER[family]}"
    enc = prompt()
    ref = gemfilter.generate(model, enc, method=parse_method(spec), max_new_tokens=6)
    out = model.generate(
        **enc, custom_generate=str(HUB), trust_remote_code=True, gemfilter_method=spec, max_new_tokens=6
    )
    assert torch.equal(out, ref.output)
    assert ref.kept == [12]  # the filter ran: 12 of 40 prompt tokens


def test_generate_without_custom_generate_is_untouched():
    model = BUILDERS["llama"]()
    enc = prompt()
    before = model.generate(**enc, max_new_tokens=6, do_sample=False)
    model.generate(
        **enc,
        custom_generate=str(HUB),
        trust_remote_code=True,
        gemfilter_method="gemfilter:k=12,layer=2",
        max_new_tokens=6,
    )
    after = model.generate(**enc, max_new_tokens=6, do_sample=False)
    assert torch.equal(before, after)
    assert "generate" not in model.__dict__
    filtered = gemfilter.generate(model, enc, method=parse_method("gemfilter:k=12,layer=2"), max_new_tokens=6)
    assert not torch.equal(before, filtered.output)  # so the equality above says something


def test_custom_generate_takes_positional_ids_a_batch_a_method_object_and_returns_the_gemfilter_output():
    model = BUILDERS["qwen2"]()
    enc = prompt(batch=2)
    enc["attention_mask"][1, :5] = 0  # left padding in the second row
    method = gemfilter.GemFilter(layer=2, topk=10)
    ref = gemfilter.generate(model, enc, method=method, max_new_tokens=4)
    out = model.generate(
        enc["input_ids"],
        attention_mask=enc["attention_mask"],
        custom_generate=str(HUB),
        trust_remote_code=True,
        gemfilter_method=method,
        gemfilter_output=True,
        max_new_tokens=4,
    )
    assert isinstance(out, gemfilter.GemFilterOutput)
    assert torch.equal(out.sequences, ref.sequences) and out.kept == ref.kept
    span = model.generate(
        **prompt(),
        custom_generate=str(HUB),
        trust_remote_code=True,
        gemfilter_method="gemfilter-span:k=12,layer=2",
        gemfilter_tokenizer=DotTokenizer(),
        max_new_tokens=4,
    )
    ref = gemfilter.generate(
        model, prompt(), method=parse_method("gemfilter-span:k=12,layer=2"), tokenizer=DotTokenizer(), max_new_tokens=4
    )
    assert torch.equal(span, ref.output)


def test_a_bad_spec_is_the_spec_s_own_error():
    model = BUILDERS["llama"]()
    with pytest.raises(ValueError, match="unknown method 'gemfiltr'; allowed: "):
        model.generate(**prompt(), custom_generate=str(HUB), trust_remote_code=True, gemfilter_method="gemfiltr")


def test_without_trust_remote_code_transformers_refuses_the_folder():
    model = BUILDERS["llama"]()
    with pytest.raises(ValueError, match="trust_remote_code"):
        model.generate(**prompt(), custom_generate=str(HUB), gemfilter_method="gemfilter:k=12,layer=2")


def test_export_hub_writes_the_repo_and_it_runs(tmp_path, capsys):
    out = tmp_path / "repo"
    assert main(["export-hub", str(out), "--repo-id", "acme/gemfilter"]) == 0
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(FILES)
    for name in FILES[1:]:
        assert (out / name).read_bytes() == (HUB / name).read_bytes()
    card = (out / "README.md").read_text()
    assert 'custom_generate="acme/gemfilter"' in card and "your-org/gemfilter" not in card
    assert f"hf upload acme/gemfilter {out} ." in capsys.readouterr().out
    model = BUILDERS["llama"]()
    enc = prompt()
    got = model.generate(
        **enc,
        custom_generate=str(out),
        trust_remote_code=True,
        gemfilter_method="gemfilter:k=12,layer=2",
        max_new_tokens=5,
    )
    assert torch.equal(
        got, gemfilter.generate(model, enc, method=parse_method("gemfilter:k=12,layer=2"), max_new_tokens=5).output
    )


def test_export_hub_refuses_a_folder_with_files_in_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["export-hub", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--force" in err
    assert main(["export-hub", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / FILES[1]).exists()
    assert main(["export-hub", str(tmp_path), "--repo-id", "no-slash"]) == 2
    assert "--repo-id must be OWNER/NAME" in capsys.readouterr().err


TRANSFORMERS_517 = Path("/tmp/v517/bin/python")


@pytest.mark.skipif(not TRANSFORMERS_517.exists(), reason="no transformers 5.17 venv at /tmp/v517 (the range's floor)")
def test_custom_generate_under_transformers_5_17(tmp_path):
    """The floor of the supported range loads the folder the same way (its loader checks requirements.txt against
    installed distributions, so the package is installed from a wheel into a folder of its own)."""
    src, wheel = tmp_path / "src", tmp_path / "wheel"  # built from a copy: a build writes into its source folder
    shutil.copytree(ROOT / "gemfilter", src / "gemfilter", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheel), str(src)],
        check=True,
        capture_output=True,
    )
    target = tmp_path / "site"
    subprocess.run(
        [
            str(TRANSFORMERS_517),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            *map(str, wheel.glob("*.whl")),
        ],
        check=True,
        capture_output=True,
    )
    shutil.copytree(ROOT / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__", "data"))
    code = f"""
import sys, torch, transformers
sys.path[:0] = [{str(target)!r}, {str(tmp_path / "tests")!r}]
import gemfilter
from gemfilter.methods import parse_method
from tiny_models import BUILDERS
assert transformers.__version__ == "5.17.0", transformers.__version__
model = BUILDERS["llama"]()
torch.manual_seed(1)
enc = {{"input_ids": torch.randint(3, 90, (1, 40))}}
ref = gemfilter.generate(model, enc, method=parse_method("gemfilter:k=12,layer=2"), max_new_tokens=6).output
out = model.generate(**enc, custom_generate={str(HUB)!r}, trust_remote_code=True,
                     gemfilter_method="gemfilter:k=12,layer=2", max_new_tokens=6)
assert torch.equal(out, ref), (out, ref)
print("ok", gemfilter.__file__)
"""
    res = subprocess.run([str(TRANSFORMERS_517), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("ok " + str(target)), res.stderr[-3000:]
