"""``gemfilter-lm-eval``: lm-evaluation-harness's own command line with the ``gemfilter`` model registered.

Everything after the command is the harness's (``--tasks``, ``--limit``, ``--output_path``,
``--log_samples``, ``--include_path``, ...); ``--model gemfilter`` picks this project's adapter.
"""

from __future__ import annotations

import sys
from gemfilter.entry import command, require

USAGE = """gemfilter-lm-eval: lm-evaluation-harness with every gemfilter method (model class 'gemfilter').

  gemfilter-lm-eval run --model gemfilter \\
      --model_args pretrained=embedded,method=gemfilter-span,topk=256 \\
      --tasks <task> --include_path <dir of task YAMLs> --output_path results/lm-eval --log_samples

model_args: pretrained (HF id, path, or 'embedded'), method (see 'gemfilter methods'), topk or ratio,
layer, attn (banded, sdpa, eager), and every argument of the harness's 'hf' model (dtype, device,
batch_size, ...). The harness's own help follows.
"""


@command(name="gemfilter-lm-eval")
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[-1] in ("-h", "--help"):
        print(USAGE)
    require("lm-eval", "gemfilter-lm-eval")
    import eval.harness.adapter  # noqa: F401  (registers the 'gemfilter' model class)
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["gemfilter-lm-eval", *argv]
    try:
        cli_evaluate()
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
