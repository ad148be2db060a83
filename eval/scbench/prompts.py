"""SCBench's prompts in both shared-context modes, and the token ids each turn feeds the model.

Source: microsoft/MInference ``scbench/eval_utils.py``: ``create_multiturn_prompt`` (multi-turn),
``create_scdq_prompt`` (multi-request, "same context different query"), ``get_ground_truth``, and the
way ``GreedySearch.test`` / ``test_scdq`` and ``GreedySearch_vLLM.test`` turn the prompt texts into token
ids; ``scbench/run_scbench.py``: ``truncate_input``, ``truncate_by_tokens`` and the input budget
``max_input_length``.

What the official code does, and what these functions return:

- multi-turn (``mode="multi-turn"``): turn 1 is the template with the context and the first input;
  every later turn is a follow-up text that is *appended* to the conversation. By default (the
  official scripts never pass ``--disable_golden_context``) a follow-up starts with the gold answer of
  the turn before it (``{pre_ans}``), and the model's own answer is dropped from the cache after each
  turn: turn t reads ``first + follow_up_1 + ... + follow_up_t``. With ``gold=False``
  (``--disable_golden_context``) the follow-ups are the bare chat follow-up template and the model's
  own answers stay in the history.
- multi-request (``mode="multi-request"``): one context prompt (no question), then each query alone
  after it: request t reads ``context + query_t``.
- ``chat=True`` (``--use_chat_template``, which the official scripts pass) wraps each piece with the
  tokenizer's chat template exactly as the official code does: follow-ups render
  ``[system "", assistant <gold answer>, user <follow-up>]`` and strip the rendering of
  ``[system ""]``; multi-request pieces are cut out of a rendering at a ``[SEPSEPSEP]`` marker.

Both modes return :class:`Prompts`: ``first`` (the official ``prompts[0]``) and ``follow_ups`` (the
official ``prompts[1:]``), so a conversation API can send ``first`` and then append each follow-up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .tasks import Task, get_task

MODES = ("multi-turn", "multi-request")
SPECIAL_DELIMITER = "[SEPSEPSEP]"  # create_scdq_prompt's marker
OPTION_LETTERS = "ABCD"


@dataclass(frozen=True)
class Prompts:
    """One sample's prompt texts in one mode.

    first: the text of turn 1 (multi-turn) or the shared context (multi-request); follow_ups: the text
    appended for each later turn (multi-turn) or each query (multi-request); ground_truth: the official
    per-turn labels (``get_ground_truth``); mode: a name in :data:`MODES`.
    """

    first: str
    follow_ups: list
    ground_truth: list
    mode: str

    @property
    def prompts(self) -> list:
        """The official ``encoded_eg["prompts"]`` list."""
        return [self.first, *self.follow_ups]


def mf_prefix(text: str) -> str:
    """Math.Find's question prefix: ``What is <target>?`` from an input like '... The largest number of the list is: '.

    The official regex ``The .+ is`` is greedy: the target runs to the last ' is' of the input.
    """
    found = re.findall(r"The .+ is", text)
    if not found:
        raise ValueError(f"a scbench_mf input must contain 'The <target> is' (the official prefix regex); got {text!r}")
    return f"What is {found[0].lower()[:-3]}?"


def _input(eg, i, chat_follow_up=False):
    return {"input": eg["multi_turns"][i]["input"]}


def _mf(eg, i, chat_follow_up=False):
    turns = eg["multi_turns"]
    # create_multiturn_prompt's chat branch formats every follow-up with the variable ``prefix`` left over
    # from its loop, i.e. the LAST turn's prefix; kept as the official code path does it.
    source = turns[-1]["input"] if chat_follow_up else turns[i]["input"]
    return {"prefix": mf_prefix(source), "input": turns[i]["input"]}


def _question(eg, i, chat_follow_up=False):
    return {"question": eg["multi_turns"][i]["input"]}


def _choice(eg, i, chat_follow_up=False):
    turn = eg["multi_turns"][i]
    return {"question": turn["input"], **{f"OPTION_{c}": turn["options"][j] for j, c in enumerate(OPTION_LETTERS)}}


def _said(eg, i, chat_follow_up=False):
    """This project's tasks (eval/scbench/own.py): the input, and the turn before's gold answer as a sentence."""
    return {"input": eg["multi_turns"][i]["input"], "said": eg["multi_turns"][i - 1]["said"] if i else ""}


#: Task.fields -> the template keyword arguments of turn i (the official builders' per-branch format calls; ``said``
#: is this project's own).
FIELDS = {"input": _input, "mf": _mf, "question": _question, "choice": _choice, "said": _said}


def get_ground_truth(eg: dict, task: str) -> list:
    """Per-turn labels as the runner stores them (``get_ground_truth``): [answer, letter] for
    En.MultiChoice, [answer] for En.QA, the answer itself otherwise."""
    out = []
    for turn in eg["multi_turns"]:
        if task == "scbench_choice_eng":
            out.append([turn["answer"], OPTION_LETTERS[turn["options"].index(turn["answer"])]])
        elif task == "scbench_qa_eng":
            out.append([turn["answer"]])
        else:
            out.append(turn["answer"])
    return out


def _context(eg):
    return eg["context"] if "context" in eg else eg["input"]


def _check(eg: dict, task: Task) -> None:
    turns = eg.get("multi_turns") if isinstance(eg, dict) else None
    if not turns or not isinstance(turns, list) or not all(isinstance(t, dict) and "input" in t for t in turns):
        raise ValueError(
            f"{task.name}: a sample needs 'context' and a non-empty 'multi_turns' list of "
            "{'input', 'answer'} objects (the official data format)"
        )
    if "context" not in eg and "input" not in eg:
        raise ValueError(f"{task.name}: a sample needs a 'context' field")


def build_multi_turn(eg: dict, task: str, tokenizer=None, chat: bool = False, gold: bool = True) -> Prompts:
    """``create_multiturn_prompt``: turn 1's text and the follow-up text of each later turn.

    eg: a sample in the official format; task: an official data name; tokenizer: needed when chat is
    True (its ``apply_chat_template``); chat: ``--use_chat_template``; gold: False for
    ``--disable_golden_context`` (follow-ups without the previous gold answer).
    """
    spec = get_task(task)
    _check(eg, spec)
    fields = FIELDS[spec.fields]
    turns = eg["multi_turns"]
    follow_template = spec.follow_up if gold else spec.follow_up_chat
    first = spec.template.format(context=_context(eg), **fields(eg, 0))
    follow_ups = [
        follow_template.format(pre_ans=turns[i - 1]["answer"] if gold else None, **fields(eg, i))
        for i in range(1, len(turns))
    ]
    if chat:
        _need_chat(tokenizer, task)
        first = tokenizer.apply_chat_template(
            [{"role": "user", "content": first}], add_generation_prompt=True, tokenize=False
        )
        system = tokenizer.apply_chat_template(
            [{"role": "system", "content": ""}], add_generation_prompt=gold, tokenize=False
        )
        follow_ups = []
        for i in range(1, len(turns)):
            history = (
                [{"role": "system", "content": ""}, {"role": "assistant", "content": str(turns[i - 1]["answer"])}]
                if gold
                else []
            )
            user = {"role": "user", "content": spec.follow_up_chat.format(**fields(eg, i, chat_follow_up=True))}
            text = tokenizer.apply_chat_template(history + [user], add_generation_prompt=True, tokenize=False)
            follow_ups.append(text.replace(system, "") + spec.chat_suffix)
    return Prompts(first, follow_ups, get_ground_truth(eg, task), "multi-turn")


def build_multi_request(eg: dict, task: str, tokenizer=None, chat: bool = False) -> Prompts:
    """``create_scdq_prompt``: the shared context prompt and each query on its own.

    eg, task, tokenizer, chat: as :func:`build_multi_turn` (multi-request has no gold-answer option).
    """
    spec = get_task(task)
    _check(eg, spec)
    fields = FIELDS[spec.fields]
    turns = eg["multi_turns"]
    if isinstance(spec.scdq_template, tuple):
        context_template, query_template = spec.scdq_template
    else:
        context_template, query_template = spec.scdq_template, spec.follow_up_chat
    # Math.Find's context prompt takes the first raw input as its prefix (create_scdq_prompt).
    extra = {"prefix": turns[0]["input"]} if spec.fields == "mf" else {}
    first = context_template.format(context=_context(eg), **extra)
    queries = [query_template.format(**fields(eg, i)) for i in range(len(turns))]
    if chat:
        _need_chat(tokenizer, task)
        first = tokenizer.apply_chat_template(
            [{"role": "user", "content": first + SPECIAL_DELIMITER}], add_generation_prompt=True, tokenize=False
        ).split(SPECIAL_DELIMITER)[0]
        queries = [
            tokenizer.apply_chat_template(
                [{"role": "system", "content": ""}, {"role": "user", "content": SPECIAL_DELIMITER + q}],
                add_generation_prompt=True,
                tokenize=False,
            ).split(SPECIAL_DELIMITER)[1]
            for q in queries
        ]
    return Prompts(first, queries, get_ground_truth(eg, task), "multi-request")


def build_prompts(eg: dict, task: str, mode: str, tokenizer=None, chat: bool = False, gold: bool = True) -> Prompts:
    """:func:`build_multi_turn` or :func:`build_multi_request` by ``mode`` (a name in :data:`MODES`)."""
    if mode == "multi-turn":
        return build_multi_turn(eg, task, tokenizer, chat, gold)
    if mode == "multi-request":
        if not gold:
            raise ValueError(
                "gold=False (--disable_golden_context) applies to multi-turn only; the official "
                "multi-request mode has no previous answers"
            )
        return build_multi_request(eg, task, tokenizer, chat)
    raise ValueError(f"unknown SCBench mode {mode!r}; allowed: {', '.join(MODES)}")


def _need_chat(tokenizer, task):
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{task}: chat=True needs a tokenizer with a chat template (--use_chat_template); "
            "pass one, or chat=False for the plain templates"
        )


def max_input_length(task: str, max_seq_length: int, turns: int, mode: str) -> int:
    """``run_scbench.py``'s budget for the first prompt: the window minus every turn's new tokens
    (half of the summed sub-task lengths for the Mix tasks), minus 1000 more in multi-request mode."""
    new = get_task(task).max_new_tokens
    budget = max_seq_length - (sum(new.values()) * turns // 2 if isinstance(new, dict) else new * turns)
    return budget - 1000 if mode == "multi-request" else budget


def truncate_middle(ids: list, max_length: int) -> list:
    """``truncate_input``: keep ``max_length // 2`` ids from each end when longer (max_length < 0: no limit)."""
    if max_length < 0 or len(ids) <= max_length:
        return list(ids)
    split = max_length // 2
    return list(ids[:split]) + list(ids[-split:])


def turn_input_ids(prompts: Prompts, tokenizer, turn: int, max_length: int = -1, answers: list | None = None) -> list:
    """The token ids the official runner feeds for turn ``turn`` (0-based), prompt and history together.

    The first text is encoded with the tokenizer's special tokens and middle-truncated to ``max_length``
    (``truncate_by_tokens``); each later text is encoded without special tokens and appended.
    Multi-turn: turn t reads the first prompt and follow-ups 1..t. Multi-request: the context then query t.
    answers: the model's own answer texts of the earlier turns, for ``gold=False`` prompts; each is
    appended, encoded, with the EOS token, before the next follow-up (``GreedySearch_vLLM.test``).
    """
    if not 0 <= turn < len(prompts.ground_truth):
        raise ValueError(f"turn {turn} is out of range; this sample has turns 0..{len(prompts.ground_truth) - 1}")
    ids = truncate_middle(tokenizer.encode(prompts.first), max_length)
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    if prompts.mode == "multi-request":
        return ids + enc(prompts.follow_ups[turn])
    if answers is not None and len(answers) < turn:
        raise ValueError(f"turn {turn} needs the model's answers of the {turn} earlier turns; got {len(answers)}")
    for i in range(turn):
        if answers is not None:
            ids += enc(answers[i]) + [tokenizer.eos_token_id]
        ids += enc(prompts.follow_ups[i])
    return ids
