"""What a selection keeps of GF.MultiKey's needles: for each multi-request prompt of a sample (the context and one
question, the prompt ``reselect`` selects from on that turn), whether the asked needle is kept whole, and which other
needles are. With ``--mode multi-turn`` the prompts are the multi-turn ones (the first prompt, then each follow-up with
the previous turn's gold answer), so turn t's record is ``reselect``'s selection on turn t of a conversation, and turn
0's is what ``reuse`` keeps for all five turns.

Writes one JSON line per prompt: {seed, turn, key, asked_whole, value_kept, others_whole}. The numbers in
docs/scbench.md's GF.MultiKey section come from

    python scripts/multikey_kept.py --method gemfilter-span --topk 256 --length 4096 --seeds 20 \\
        --out measured/scbench-own-multikey-methods/kept-gemfilter-span-k256.jsonl

run with the embedded model on 2 threads (about 5 s a prompt on this project's 2-core machine).

With ``--stable-layout``: what the ``stable`` layout shows the model on GF.MultiKey's multi-turn turns, beside
what ``reselect`` shows it.

``stable`` (:mod:`gemfilter.stable`) keeps last turn's kept tokens in their slots and appends the ones a turn newly
keeps after them, so the model reads the kept tokens in slot order, not history order. For each turn of a
multi-turn conversation (the runner's feed: the first prompt, then each follow-up, which starts with the previous
turn's gold answer) this records what that order does to the turn's evidence:

- ``asked_whole``: the selection keeps the asked needle's sentence whole (in history order, as ``reselect`` reads);
- ``asked_in_layout``: the sentence reads whole in slot order (False: its tokens are split between old and new
  slots, or a dropped token's slot is masked between them);
- ``appended_context``: how many of the slots this turn appends come from the first prompt (context and first
  question), before the follow-ups' tokens; ``appended``: all it appends; ``rebuilt``: the layout was rebuilt;
- ``tail``: the last 240 characters of the layout in slot order, what the model reads just before answering;
- ``prediction`` and ``right``: the turn's answer under ``stable`` (as the runner scores it);
- whether the answer is right when the same kept tokens run from scratch, one forward, in three orders:
  ``slot_order_right`` (the layout's order and positions: what ``stable`` computes, less the keys and values that
  older slots kept from the turns they were written in), ``history_order_right`` (history order at 0..k-1:
  ``reselect``'s prompt) and ``context_first_right`` (the layout's order for the first prompt's context, then every
  kept token from the first question on in history order, so no newly kept context sits between a question and
  its gold answer).

Writes one JSON line per turn: {seed, turn, key, rebuilt, appended, appended_context, asked_whole,
asked_in_layout, right, slot_order_right, history_order_right, context_first_right, prediction, tail}. The numbers
in docs/scbench.md's GF.MultiKey section come from

    python scripts/multikey_kept.py --stable-layout --method gemfilter-span-qmax --topk 256 --length 4096 \\
        --seeds 10 --out measured/scbench-own-multikey-qmax/layout-gemfilter-span-qmax-k256.jsonl

run with the embedded model on 2 threads (about 2 minutes a sample on this project's 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import re


def kept(model, tok, method, seed: int, length: int, mode: str = "multi-request", turns: int | None = None) -> list:
    """One record per turn of GF.MultiKey sample ``seed`` sized to ``length`` tokens, selected at the method's layer
    (the model's default when it sets none, as the runner's).

    mode: ``multi-request`` (turn t's prompt is the context and query t) or ``multi-turn`` (turn t's prompt is the
    first prompt and follow-ups 1..t with the gold answers, what ``reselect`` selects from; turn 0's selection is
    what ``reuse`` keeps for the whole conversation). turns: only the first ``turns`` turns (default all)."""
    import torch

    import gemfilter
    from eval.scbench.generate import make_sample
    from eval.scbench.prompts import build_prompts
    from eval.scbench.runner import feed

    sample = make_sample("gf_multikey", tok, length, seed=seed, mode=mode)
    prompts = build_prompts(sample, "gf_multikey", mode)
    layer = method.layer if method.layer is not None else method.default_layer(model)
    needles = re.findall(r"The special magic number for ([\w ]+?) is: (\d+)\.", sample["context"])
    out = []
    first, pieces = feed(prompts, tok, "gf_multikey", length)
    for t in range(len(prompts.ground_truth))[:turns]:
        # turn t's prompt, as the runner feeds it: the context and query t, or the conversation up to question t
        ids = torch.tensor([first + (pieces[t] if mode == "multi-request" else sum(pieces[:t], []))])
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


def layout_turns(model, tok, method, seed: int, length: int, upto: int | None = None) -> list:
    """One record per turn of GF.MultiKey sample ``seed`` sized to ``length`` tokens, multi-turn, under ``stable``
    (the method's layer, or the model's default when it sets none, as the runner's); ``upto``: the first turns
    only."""
    import gemfilter
    from eval.scbench.generate import make_sample
    from eval.scbench.prompts import build_prompts
    from eval.scbench.runner import feed
    from eval.scbench.scoring import score_one
    from eval.scbench.tasks import get_task

    sample = make_sample("gf_multikey", tok, length, seed=seed, mode="multi-turn")
    prompts = build_prompts(sample, "gf_multikey", "multi-turn")
    needles = re.findall(r"The special magic number for ([\w ]+?) is: (\d+)\.", sample["context"])
    first, pieces = feed(prompts, tok, "gf_multikey", length)  # as the runner feeds the conversation
    asks = [first, *pieces]
    context = len(tok.encode(prompts.first[: prompts.first.rindex("What is")]))  # where the first question starts
    new = get_task("gf_multikey").max_new_tokens
    out = []
    with gemfilter.Conversation(model, method, tok, protocol="stable", keep="questions") as chat:
        for t, ids in enumerate(asks[:upto]):
            turn = chat.ask(ids, max_new_tokens=new)
            history = chat.history[0]
            layout = chat._layout  # keep="questions": the layout the turn answered on, before its answer
            gold = prompts.ground_truth[t]
            key = next(k for k, v in needles if v == gold)
            sentence = f"for {key} is: {gold}"
            slots = [s for s in range(len(layout.ids)) if layout.valid[s]]
            order = [layout.ids[s] for s in slots]  # the kept history tokens in slot order
            layout_text = tok.decode(history[order])
            appended = layout.ids[layout.writes[-1][0] :]
            fresh = {  # the same kept tokens run from scratch, in three orders
                "slot_order_right": (order, [layout.pos[s] for s in slots]),
                "history_order_right": (sorted(order), list(range(len(order)))),
                "context_first_right": (
                    [h for h in order if h < context] + sorted(h for h in order if h >= context),
                    list(range(len(order))),
                ),
            }
            out.append(
                {
                    "seed": seed,
                    "turn": t,
                    "key": key,
                    "rebuilt": bool(turn.rebuilt),
                    "appended": len(appended),
                    "appended_context": sum(h < len(first) for h in appended),
                    "asked_whole": sentence in turn.selection.kept_text(tok)[0],
                    "asked_in_layout": sentence in layout_text,
                    "right": score_one("gf_multikey", turn.text, gold) == 1.0,
                    **{name: right(model, tok, history, ids, pos, new, gold) for name, (ids, pos) in fresh.items()},
                    "prediction": turn.text,
                    "tail": layout_text[-240:],
                }
            )
    return out


def right(model, tok, history, ids: list, positions: list, new: int, gold: str) -> bool:
    """Whether the greedy answer is right when the history tokens ``ids`` (history (L,)) run from scratch, in that
    order, at ``positions``: one forward over all of them, then up to ``new`` tokens (:class:`Layout`)."""
    from eval.scbench.scoring import score_one
    from gemfilter.compiled import check_keywords
    from gemfilter.stable import Layout

    fresh = Layout(model)
    logits = fresh.write(history[ids][None], ids, positions)
    settings = check_keywords(model, {"max_new_tokens": new, "do_sample": False, "num_beams": 1})
    answer = fresh.decode(logits, settings, len(history))
    return score_one("gf_multikey", tok.decode(answer[0], skip_special_tokens=True), gold) == 1.0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--stable-layout",
        action="store_true",
        help="record what the stable layout shows the model on multi-turn turns (not the multi-request selections)",
    )
    parser.add_argument(
        "--mode",
        choices=("multi-request", "multi-turn"),
        default="multi-request",
        help="the prompts the selections are made on: multi-request (context and one query, the default) or "
        "multi-turn (the conversation so far, with gold answers; turn 1's selection is what reuse keeps); "
        "--stable-layout is always multi-turn",
    )
    parser.add_argument(
        "--turns", type=int, default=None, help="record only the first n turns of each sample (default all five)"
    )
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
            if args.stable_layout:
                records = layout_turns(model, tok, method, seed, args.length, upto=args.turns)
            else:
                records = kept(model, tok, method, seed, args.length, mode=args.mode, turns=args.turns)
            for record in records:
                f.write(json.dumps(record) + "\n")
                f.flush()


if __name__ == "__main__":
    main()
