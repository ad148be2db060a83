"""Does the embedded model follow a GF.VarTrack chain when asked the other way round? A probe, `full` only.

GF.VarTrack asks RULER's question ("find all variables that are assigned the value V"), on which the embedded model
scores 0-5% (docs/scbench.md). This probe asks each chain from its end instead ("What is the value of VAR B?"),
with the answer started as the chain is written ("VAR B = VAR"), so that the model can answer one hop at a time:
copy the variable B was assigned from, then that variable's value. Each multi-request prompt of GF.VarTrack sample
``seed`` (sized as the runner sizes it) is answered greedily with the whole cache; the variable names are either
RULER's (five random capitals) or, with ``--names words``, one distinct word per variable (each name of the sample
replaced in the context), as GF.MultiKey's keys of distinct kinds.

Writes one JSON line per question: {seed, turn, names, chain, value, said, first_hop, value_found}, where
``first_hop`` says whether the answer names the chain's first variable and ``value_found`` whether it holds the
value. The figures in docs/scbench.md come from

    python scripts/vt_forward_probe.py --names ruler --seeds 4 \\
        --out measured/scbench-own-calibration/vt-forward-ruler.jsonl
    python scripts/vt_forward_probe.py --names words --seeds 4 \\
        --out measured/scbench-own-calibration/vt-forward-words.jsonl

run with the embedded model on 2 threads (about 40 s a sample on this project's 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import re

#: ``--names words``: distinct one-token-ish words, upper-cased as RULER's names are; a sample uses ten of them
WORDS = (
    "OTTER FALCON ZEBRA TIGER LISBON OSLO VIENNA PRAGUE VIOLIN HARP DRUM TRUMPET BAKER PILOT SURGEON MARCH JULY "
    "OCTOBER KETTLE LAMP"
).split()
QUESTION = (
    "\n\nQuestion: What is the value of VAR {b}? Answer: Following its chain of variable assignment in the text "
    "above, VAR {b} = VAR"
)


def probe(model, tok, seed: int, length: int, names: str, new_tokens: int = 24) -> list:
    """One record per chain of GF.VarTrack sample ``seed`` (multi-request sizing for ``length`` tokens)."""
    import copy
    import random

    import torch

    from eval.scbench.generate import make_sample
    from gemfilter import compat

    sample = make_sample("gf_vt", tok, length, seed=seed, mode="multi-request")
    context = sample["context"]
    chains = [t["answer"].split(", ") for t in sample["multi_turns"]]
    values = [re.search(r"value (\d+)", t["input"]).group(1) for t in sample["multi_turns"]]
    if names == "words":
        rename = dict(zip([v for chain in chains for v in chain], random.Random(seed).sample(WORDS, 10)))
        context = re.sub(r"VAR ([A-Z]{5})\b", lambda m: "VAR " + rename[m.group(1)], context)
        chains = [[rename[v] for v in chain] for chain in chains]
    ids = tok(context, return_tensors="pt").input_ids
    with torch.no_grad():
        cache = compat.output_cache(model(ids, use_cache=True))  # the context's cache, copied for each question
    out = []
    for turn, (chain, value) in enumerate(zip(chains, values)):
        q = tok(QUESTION.format(b=chain[-1]), add_special_tokens=False, return_tensors="pt").input_ids
        prompt = torch.cat([ids, q], 1)
        cached = compat.cache_kwargs(copy.deepcopy(cache))
        gen = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, **cached)
        said = tok.decode(gen[0, prompt.shape[1] :], skip_special_tokens=True)
        first = said.split("\n")[0]  # the answer's line; what follows is the model going on with another question
        out.append(
            {
                "seed": seed,
                "turn": turn,
                "names": names,
                "chain": chain,
                "value": value,
                "said": said,
                "first_hop": re.search(rf"\b{chain[0]}\b", first) is not None,
                "value_found": value in first,
            }
        )
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", choices=("ruler", "words"), default="ruler", help="variable names (default ruler)")
    parser.add_argument("--length", type=int, default=4096, help="the window samples are sized to (default 4096)")
    parser.add_argument("--seeds", type=int, default=4, help="samples, seeds 0..n-1 (default 4)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    args = parser.parse_args(argv)

    import torch

    from gemfilter.models import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model(None)
    with open(args.out, "w", encoding="utf-8") as f:
        for seed in range(args.seeds):
            for record in probe(model, tok, seed, args.length, args.names):
                f.write(json.dumps(record) + "\n")
                f.flush()


if __name__ == "__main__":
    main()
