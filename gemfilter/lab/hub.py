"""``gemfilter export-hub DIR``: GemFilter's transformers ``custom_generate`` repo, written out for the Hub.

Paper: Shi et al. 2024, "Discovering the Gems in Early Layers" (GemFilter), Algorithm 2. transformers runs a
Hub repo's (or a local folder's) ``custom_generate/generate.py`` in place of its own decoding when
``model.generate(..., custom_generate=REPO, trust_remote_code=True)`` names it. The repo ships inside this
package (``gemfilter/hub``: the model card ``README.md``, ``custom_generate/generate.py``, which hands
``generate``'s arguments to :func:`gemfilter.generate`, and ``custom_generate/requirements.txt``); this command
copies it to a folder, ready for ``hf upload``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

#: the repo's files, relative to its root
FILES = ("README.md", "custom_generate/generate.py", "custom_generate/requirements.txt")
#: the repo id the model card's examples use until --repo-id names the real one
PLACEHOLDER = "your-org/gemfilter"

EPILOG = f"""Publish (a Hugging Face account; 'hf auth login' once):
  gemfilter export-hub gemfilter-hub --repo-id ORG/gemfilter
  hf upload ORG/gemfilter gemfilter-hub .

Use (transformers >= 5.17, with gemfilter-lab installed where it runs):
  model.generate(**enc, custom_generate="ORG/gemfilter", trust_remote_code=True,
                 gemfilter_method="gemfilter:k=1024", max_new_tokens=50)

A local folder works the same way: custom_generate="gemfilter-hub". The card's examples name
{PLACEHOLDER} unless --repo-id is given. Arguments: gemfilter_method (a spec, as --method takes
elsewhere), gemfilter_tokenizer, gemfilter_selector, gemfilter_output (the card lists them).
Paper: Shi et al. 2024, "Discovering the Gems in Early Layers" (GemFilter)."""


def source_files() -> dict:
    """{relative path: bytes} of the repo as it ships in the package."""
    from importlib.resources import files

    root = files("gemfilter").joinpath("hub")
    out = {}
    for name in FILES:
        item = root
        for part in name.split("/"):
            item = item.joinpath(part)
        out[name] = item.read_bytes()
    return out


def export(out: Path, repo_id: str | None = None, force: bool = False) -> list:
    """Write the repo to ``out`` (created if missing); returns the paths written.

    repo_id: OWNER/NAME written into the model card's examples. A folder that already holds files is refused
    (ValueError) unless ``force``; then the repo's files are overwritten and any other file is left alone.
    """
    if repo_id is not None and not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", repo_id):
        raise ValueError(f"--repo-id must be OWNER/NAME as on the Hub (e.g. acme/gemfilter), got {repo_id!r}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(
            f"{out} already holds files; give an empty or new folder, or --force to overwrite the "
            f"repo's files ({', '.join(FILES)}) there"
        )
    written = []
    for name, data in source_files().items():
        if name == "README.md" and repo_id is not None:
            data = data.decode("utf-8").replace(PLACEHOLDER, repo_id).encode("utf-8")
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)
    return written


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export-hub",
        help="write GemFilter's transformers custom_generate repo to a folder (for the Hub)",
        description="Write the Hub repo that makes model.generate(..., custom_generate=REPO, "
        "trust_remote_code=True, gemfilter_method=SPEC) run gemfilter.generate: a model card "
        "(README.md), custom_generate/generate.py and custom_generate/requirements.txt.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("out", metavar="DIR", help="folder to write the repo into (created if missing; must be empty)")
    p.add_argument(
        "--repo-id",
        default=None,
        metavar="OWNER/NAME",
        help=f"where you will publish it, written into the model card's examples (default: {PLACEHOLDER})",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="write into a folder that already holds files (the repo's files are overwritten, others kept)",
    )
    p.set_defaults(func=cmd_export_hub)


def cmd_export_hub(args) -> int:
    out = Path(args.out)
    written = export(out, args.repo_id, args.force)
    repo = args.repo_id or PLACEHOLDER
    print("\n".join(str(p) for p in written))
    print(
        f'\npublish: hf upload {repo} {out} .\nuse:     model.generate(**enc, custom_generate="{repo}", '
        'trust_remote_code=True, gemfilter_method="gemfilter:k=1024")',
        file=sys.stdout,
    )
    return 0
