"""SCBench's tasks as data: one row per task with its templates, output length, scorer and data source.

Source: microsoft/MInference ``scbench/eval_utils.py`` (``DATA_NAME_TO_MAX_NEW_TOKENS``,
``multiturn_templates``, ``multiturn_templates_scdq``, ``multiturn_follow_up_templates``,
``multiturn_follow_up_templates_in_chat_tempate``) and ``scbench/compute_scores.py``
(``Multiturnbench_to_Infinitebench`` and ``get_score_one``'s ``NAME_TO_SCORE_GETTER``). The templates
are the official strings character for character, typos included ("The the correct answer is"): the
model reads them, so a changed character is a different benchmark.

Columns of :class:`Task`:

- ``name``: the official data name (``--task`` of ``run_scbench.py``); ``label``: the paper's name;
- ``max_new_tokens``: ``DATA_NAME_TO_MAX_NEW_TOKENS`` (a dict per sub-task for the two Mix tasks);
- ``template`` / ``scdq_template`` / ``follow_up`` / ``follow_up_chat``: the four official templates;
  ``scdq_template`` is a (context, query) pair for the three book tasks and this project's own;
- ``fields``: which keyword arguments the official builder passes to the templates
  (``input``; ``mf``: input plus the ``What is ...?`` prefix; ``question``; ``choice``: question and four
  options), a key of ``eval.scbench.prompts.FIELDS``;
- ``chat_suffix``: text the official builder appends to chat-template follow-ups ("This paper" for
  summaries);
- ``scorer``: the key of ``NAME_TO_SCORE_GETTER`` that scores it (``eval.scbench.scoring.SCORERS``);
  None where the official scorer is not transcribed (RepoQA's pass@1 needs ``repo_qa_utils``);
- ``generator``: a key of ``eval.scbench.generate.GENERATORS``, None if the data must be downloaded;
- ``needs``: the data a task without a generator needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import own

_KV = "Extract the value corresponding to the specified key in the JSON object below.\n\n"
_REPOQA = (
    "Based on the function description and code context, please retrieve and repeat the exact described "
    "function from the code context in a code block wrapped by ```:\n\n"
)
_OPTIONS = "Question: {question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\n"


@dataclass(frozen=True)
class Task:
    """One SCBench task (see the module docstring for the columns)."""

    name: str
    label: str
    max_new_tokens: int | dict
    template: str
    scdq_template: str | tuple
    follow_up: str
    follow_up_chat: str
    fields: str = "input"
    chat_suffix: str = ""
    scorer: str | None = None
    generator: str | None = None
    needs: str = ""

    @property
    def offline(self) -> bool:
        """True when :mod:`eval.scbench.generate` builds its data without a download."""
        return self.generator is not None


def _plain(name, label, max_new_tokens, scorer, head="", **kw):
    """A task of the official generic branch: ``head{context}\\n\\n{input}``, follow-up ``{pre_ans}\\n\\n{input}``."""
    return Task(
        name,
        label,
        max_new_tokens,
        head + "{context}\n\n{input}",
        head + "{context}",
        "{pre_ans}\n\n{input}",
        "{input}",
        scorer=scorer,
        **kw,
    )


def _own(name, label, max_new_tokens, head, generator):
    """This project's tasks (eval/scbench/own.py): the generic branch's templates, with two differences.

    - A multi-turn follow-up starts with the turn before's gold answer completing its sentence (``said``:
      " <answer>."), where the generic ``{pre_ans}`` glues the bare answer to the answer prefix ("... is7602368"),
      which the embedded model copied.
    - A multi-request query starts with "\n\n", as a multi-turn one does: the generic ``{input}`` runs the context's
      last words into the question ("... Design is notFrom which platform ...").
    """
    return Task(
        name,
        label,
        max_new_tokens,
        head + "{context}\n\n{input}",
        (head + "{context}", "\n\n{input}"),
        "{said}\n\n{input}",
        "{input}",
        fields="said",
        scorer="gf_string_match",
        generator=generator,
    )


# fmt: off
TASKS = (
    _plain("scbench_kv", "Retr.KV", 150, "kv_retrieval", _KV, generator="kv"),
    _plain("scbench_prefix_suffix", "Retr.Prefix-Suffix", 150, "kv_retrieval", generator="prefix_suffix"),
    _plain("scbench_vt", "Retr.MultiHop", 30, "scbench_vt", generator="vt"),
    Task("scbench_mf", "Math.Find", 5, "{prefix}\n\n{context}\n\n{input}", "{prefix}\n\n{context}",
         "{pre_ans}\n\n{prefix}\n\n{input}", "{prefix}\n\n{input}", fields="mf", scorer="math_find", generator="mf"),
    _plain("scbench_repoqa", "Code.RepoQA", 1024, None, _REPOQA,
           needs="source files of real repositories with function descriptions (RepoQA's needle functions)"),
    Task("scbench_qa_eng", "En.QA", 40,
         "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\nQuestion: {question}"
         "\nAnswer:",
         ("Read the book and answer the question. Be very concise in your answer.\n\n{context}",
          "Question: {question}\nAnswer:"),
         "{pre_ans}\n\nQuestion: {question}\nAnswer:", "Question: {question}\nAnswer:", fields="question",
         scorer="longdialogue_qa_eng", needs="English novels with human-written questions (InfiniteBench En.QA)"),
    Task("scbench_qa_chn", "Zh.QA", 40, "阅读以下书籍然后回答问题。\n\n{context}\n\n问题：{question}\n答案：",
         ("阅读以下书籍然后回答问题。\n\n{context}", "问题：{question}\n答案："),
         "{pre_ans}\n\n问题：{question}\n答案：", "问题：{question}\n答案：", fields="question",
         scorer="longbook_qa_chn", needs="Chinese books with questions (InfiniteBench Zh.QA)"),
    Task("scbench_choice_eng", "En.MultiChoice", 40,
         "Read the book and answer the question.\n\n{context}\n\n" + _OPTIONS + "The the correct answer is",
         ("Read the book and answer the question.\n\n{context}", _OPTIONS + "The the correct answer is"),
         "{pre_ans}\n\n" + _OPTIONS + "The letter of the correct answer is", _OPTIONS + "The the correct answer is",
         fields="choice", scorer="longbook_choice_eng",
         needs="English novels with four-option questions (InfiniteBench En.MC)"),
    _plain("scbench_many_shot", "ICL.ManyShot", 10, "scbench_many_shot",
           needs="hundreds of labelled examples of a classification task (BIG-Bench Hard style)"),
    _plain("scbench_summary", "En.Sum", 200, "scbench_summary", chat_suffix="This paper",
           needs="long papers with reference summaries"),
    _plain("scbench_summary_with_needles", "Mix.Sum+NIAH", {"scbench_summary": 800, "scbench_passkey": 15}, None,
           needs="the En.Sum documents with passkeys inserted"),
    _plain("scbench_repoqa_and_kv", "Mix.RepoQA+KV", {"scbench_repoqa": 1024, "scbench_kv": 80}, None,
           needs="the RepoQA repositories with a KV dictionary inserted"),
    # This project's tasks in SCBench's protocol (eval/scbench/own.py), not SCBench's: RULER's needles, one per turn.
    _own("gf_facts", "GF.Facts", 32, own.FACTS_HEAD, "gf_facts"),
    _own("gf_multikey", "GF.MultiKey", 32, own.MULTIKEY_HEAD, "gf_multikey"),
    _own("gf_vt", "GF.VarTrack", 30, "", "gf_vt"),
)
# fmt: on

BY_NAME = {t.name: t for t in TASKS}
OFFLINE = tuple(t.name for t in TASKS if t.offline)
#: this project's own tasks (eval/scbench/own.py): offline, but not SCBench's
OWN = tuple(t.name for t in TASKS if t.name.startswith("gf_"))


def get_task(name: str) -> Task:
    """The task row for an official data name; ValueError lists the allowed names."""
    if name not in BY_NAME:
        raise ValueError(
            f"unknown SCBench task {name!r}; allowed: {', '.join(BY_NAME)} (generated offline: {', '.join(OFFLINE)})"
        )
    return BY_NAME[name]
