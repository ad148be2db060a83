"""``gemfilter-lm-eval``: lm-evaluation-harness's own command line with the ``gemfilter`` model registered.

Everything after the command is the harness's (``--tasks``, ``--limit``, ``--output_path``,
``--log_samples``, ``--include_path``, ...); ``--model gemfilter`` picks this project's adapter.
``python -m eval.harness`` is the same command. Plain ``lm_eval --model gemfilter`` cannot find the class
(lm-eval 0.4.13 loads no plugin entry points); from Python, ``import eval.harness.adapter`` first.
"""

from __future__ import annotations

import sys

from gemfilter.toolkit.entry import command, require

USAGE = """gemfilter-lm-eval: lm-evaluation-harness with every gemfilter method (model class 'gemfilter').

  gemfilter-lm-eval run --model gemfilter \\
      --model_args pretrained=embedded,method=gemfilter-span,topk=256 \\
      --tasks <task> --include_path <dir of task YAMLs> --output_path results/lm-eval --log_samples

model_args: pretrained (HF id, path, or 'embedded'), method (a spec, e.g. gemfilter-span:k=256 or
snapkv:ratio=0.1; see 'gemfilter methods NAME'), topk or ratio and layer (defaults for a spec that sets
none), any other method parameter as its own key (method=fastkv:k=512,tsp_len=2048 works: tsp_len joins
the spec), attn (banded, sdpa, eager), and every argument of the harness's 'hf' model (dtype, revision, ...);
batch_size and device are the harness's own --batch_size and --device. 'python -m eval.harness' is the
same command; plain 'lm_eval --model gemfilter' cannot find the class (from Python: import
eval.harness.adapter before lm_eval.simple_evaluate). The harness's own help follows.
"""


@command(name="gemfilter-lm-eval")
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[-1] in ("-h", "--help"):
        print(USAGE)
    require("lm-eval", "gemfilter-lm-eval")
    from lm_eval.__main__ import cli_evaluate

    import eval.harness.adapter  # noqa: F401  (registers the 'gemfilter' model class)

    sys.argv = ["gemfilter-lm-eval", *argv]
    try:
        cli_evaluate()
    except SystemExit as stop:
        return int(stop.code or 0)
    except (ValueError, OSError) as err:  # a bad model_arg or task choice, a missing model or file: one line
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
