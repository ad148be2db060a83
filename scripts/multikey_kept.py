"""What a selection keeps of GF.MultiKey's needles: for each multi-request prompt of a sample (the context and one
question, the prompt ``reselect`` selects from on that turn), whether the asked needle is kept whole, and which other
needles are.

Writes one JSON line per prompt: {seed, turn, key, asked_whole, value_kept, others_whole}. The numbers in
docs/scbench.md's GF.MultiKey section come from

    python scripts/multikey_kept.py --method gemfilter-span --topk 256 --length 4096 --seeds 20 \\
        --out measured/scbench-own-multikey-methods/kept-gemfilter-span-k256.jsonl

run with the embedded model on 2 threads (about 5 s a prompt on this project's 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import re


def kept(model, tok, method, seed: int, length: int) -> list:
    """One record per turn of GF.MultiKey sample ``seed`` sized to ``length`` tokens (multi-request), selected at
    the method's layer (the model's default when it sets none, as the runner's)."""
    import torch

    import gemfilter
    from eval.scbench.generate import make_sample
    from eval.scbench.prompts import build_prompts, turn_input_ids

    sample = make_sample("gf_multikey", tok, length, seed=seed, mode="multi-request")
    prompts = build_prompts(sample, "gf_multikey", "multi-request")
    layer = method.layer if method.layer is not None else method.default_layer(model)
    needles = re.findall(r"The special magic number for ([\w ]+?) is: (\d+)\.", sample["context"])
    out = []
    for t in range(len(prompts.follow_ups)):
        ids = torch.tensor([turn_input_ids(prompts, tok, t)])  # the context, then query t, as the runner feeds it
        selection = gemfilter.select_tokens(model, ids, layer=layer, topk=method.topk, method=method, tokenizer=tok)
        text = selection.kept_text(tok)[0]
        gold = sample["multi_turns"][t]["answer"]
        key = next(k for k, v in needles if v == gold)
        whole = [k for k, v in needles if f"for {k} is: {v}" in text]
        out.append(
            {
                "seed": seed,
                "turn": t,
                "key": key,
                "asked_whole": key in whole,
                "value_kept": gold in text,
                "others_whole": [k for k in whole if k != key],
            }
        )
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="gemfilter-span", help="a prompt method's name (default gemfilter-span)")
    parser.add_argument("--topk", type=int, default=256, help="tokens kept (default 256)")
    parser.add_argument("--length", type=int, default=4096, help="the window samples are sized to (default 4096)")
    parser.add_argument("--seeds", type=int, default=10, help="samples, seeds 0..n-1 (default 10)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    args = parser.parse_args(argv)

    import torch

    import gemfilter
    from gemfilter.models import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model(None)
    method = gemfilter.get_method(args.method, topk=args.topk)
    with open(args.out, "w", encoding="utf-8") as f:
        for seed in range(args.seeds):
            for record in kept(model, tok, method, seed, args.length):
                f.write(json.dumps(record) + "\n")
                f.flush()


if __name__ == "__main__":
    main()
