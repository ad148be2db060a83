"""LongBench v1 English tasks as data: one row per task (config, category, metric, max_new_tokens, template).

Source: THUDM/LongBench (v1) ``config/dataset2prompt.json``, ``dataset2maxlen.json``, ``eval.py`` and
``pred.py``; the category grouping and column names follow the GemFilter paper's Table 9.1 (Shi et al.
2024). Templates are the official ones character for character, typos ("asconcisely"), qasper's
leading space in " Answer the question" and trailing spaces included: a changed character changes
the model's answers, and the point of the eval is comparing with published numbers.

Columns of :data:`TASKS`:

- ``config``: the Hugging Face config of ``THUDM/LongBench`` and the ``<config>.jsonl`` file name;
- ``category``: the group it is reported under; ``metric``: a name in ``eval.longbench.metrics.METRICS``;
- ``max_new_tokens``: greedy generation length (official ``dataset2maxlen.json``);
- ``short``: column label in the report (the paper's);
- ``first_line``: score only the first line of the prediction (official eval.py: trec, triviaqa,
  samsum, and the Chinese lsht that is not in this table);
- ``chat``: the optional chat template applies (pred.py leaves the few-shot and code tasks raw);
- ``samples``: records in the v1 test split (a full run with fewer means incomplete data);
- ``e``: LongBench-E has a ``<config>_e`` variant;
- ``template``: filled with ``template.format(**record)``.
"""

from __future__ import annotations

from dataclasses import dataclass

SINGLE, MULTI, SUMM, FEW, SYNTH, CODE = (
    "single-doc QA",
    "multi-doc QA",
    "summarization",
    "few-shot",
    "synthetic",
    "code",
)
#: Categories in report order, with the paper's Table 9.1 headings.
CATEGORIES = {
    SINGLE: "Single-Document QA",
    MULTI: "Multi-Document QA",
    SUMM: "Summarization",
    FEW: "Few-shot Learning",
    SYNTH: "Synthetic",
    CODE: "Code",
}


@dataclass(frozen=True)
class Task:
    """One LongBench task (see the module docstring for the columns)."""

    config: str
    category: str
    metric: str
    max_new_tokens: int
    short: str
    first_line: bool
    chat: bool
    samples: int
    e: bool
    template: str

    def e_config(self) -> str:
        """The LongBench-E config name (``qasper_e``); ValueError if the task has none."""
        if not self.e:
            raise ValueError(
                f"task {self.config!r} has no LongBench-E variant; LongBench-E tasks: "
                f"{', '.join(t.config for t in TASKS if t.e)}"
            )
        return self.config + "_e"

    def prompt(self, record: dict) -> str:
        """The official prompt for one record (``template.format(**record)``)."""
        missing = [k for k in ("context", "input") if "{" + k + "}" in self.template and k not in record]
        if missing:
            raise ValueError(f"{self.config} record lacks field(s) {', '.join(missing)} needed by its template")
        return self.template.format(**record)


# hotpotqa, 2wikimqa and musique share this official template, character for character.
MULTI_DOC_TEMPLATE = (
    "Answer the question based on the given passages. Only give me the answer and do not output any "
    "other words.\n\n"
    "The following are given passages.\n"
    "{context}\n\n"
    "Answer the question based on the given passages. Only give me the answer and do not output any "
    "other words.\n\n"
    "Question: {input}\n"
    "Answer:"
)

# fmt: off
TASKS = (
    Task("narrativeqa", SINGLE, "qa_f1", 128, "NrtvQA", first_line=False, chat=True, samples=200, e=False,
         template=(
             "You are given a story, which can be either a novel or a movie script, and a question. Answer "
             "the question asconcisely as you can, using a single phrase if possible. Do not provide any "
             "explanation.\n\n"
             "Story: {context}\n\n"
             "Now, answer the question based on the story asconcisely as you can, using a single phrase if "
             "possible. Do not provide any explanation.\n\n"
             "Question: {input}\n\n"
             "Answer:"
         )),
    Task("qasper", SINGLE, "qa_f1", 128, "Qasper", first_line=False, chat=True, samples=200, e=True,
         template=(
             "You are given a scientific article and a question. Answer the question as concisely as you "
             "can, using a single phrase or sentence if possible. If the question cannot be answered based "
             'on the information in the article, write "unanswerable". If the question is a yes/no question, '
             'answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\n'
             "Article: {context}\n\n"
             " Answer the question based on the above article as concisely as you can, using a single phrase "
             "or sentence if possible. If the question cannot be answered based on the information in the "
             'article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or '
             '"unanswerable". Do not provide any explanation.\n\n'
             "Question: {input}\n\n"
             "Answer:"
         )),
    Task("multifieldqa_en", SINGLE, "qa_f1", 64, "MF-en", first_line=False, chat=True, samples=150, e=True,
         template=(
             "Read the following text and answer briefly.\n\n"
             "{context}\n\n"
             "Now, answer the following question based on the above text, only give me the answer and do not "
             "output any other words.\n\n"
             "Question: {input}\n"
             "Answer:"
         )),
    Task("hotpotqa", MULTI, "qa_f1", 32, "HotpotQA", first_line=False, chat=True, samples=200, e=True,
         template=MULTI_DOC_TEMPLATE),
    Task("2wikimqa", MULTI, "qa_f1", 32, "2WikiMQA", first_line=False, chat=True, samples=200, e=True,
         template=MULTI_DOC_TEMPLATE),
    Task("musique", MULTI, "qa_f1", 32, "Musique", first_line=False, chat=True, samples=200, e=False,
         template=MULTI_DOC_TEMPLATE),
    Task("gov_report", SUMM, "rouge", 512, "GovReport", first_line=False, chat=True, samples=200, e=True,
         template=(
             "You are given a report by a government agency. Write a one-page summary of the report.\n\n"
             "Report:\n"
             "{context}\n\n"
             "Now, write a one-page summary of the report.\n\n"
             "Summary:"
         )),
    Task("qmsum", SUMM, "rouge", 512, "QMSum", first_line=False, chat=True, samples=200, e=False,
         template=(
             "You are given a meeting transcript and a query containing a question or instruction. Answer "
             "the query in one or more sentences.\n\n"
             "Transcript:\n"
             "{context}\n\n"
             "Now, answer the query based on the above meeting transcript in one or more sentences.\n\n"
             "Query: {input}\n"
             "Answer:"
         )),
    Task("multi_news", SUMM, "rouge", 512, "MultiNews", first_line=False, chat=True, samples=200, e=True,
         template=(
             "You are given several news passages. Write a one-page summary of all news. \n\n"
             "News:\n"
             "{context}\n\n"
             "Now, write a one-page summary of all the news.\n\n"
             "Summary:"
         )),
    Task("trec", FEW, "classification", 64, "TREC", first_line=True, chat=False, samples=200, e=True,
         template=(
             "Please determine the type of the question below. Here are some examples of questions.\n\n"
             "{context}\n"
             "{input}"
         )),
    Task("triviaqa", FEW, "qa_f1", 32, "TriviaQA", first_line=True, chat=False, samples=200, e=True,
         template=(
             "Answer the question based on the given passage. Only give me the answer and do not output any "
             "other words. The following are some examples.\n\n"
             "{context}\n\n"
             "{input}"
         )),
    Task("samsum", FEW, "rouge", 128, "SAMSum", first_line=True, chat=False, samples=200, e=True,
         template=(
             "Summarize the dialogue into a few short sentences. The following are some examples.\n\n"
             "{context}\n\n"
             "{input}"
         )),
    Task("passage_count", SYNTH, "count", 32, "PCount", first_line=False, chat=True, samples=200, e=True,
         template=(
             "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please "
             "carefully read these paragraphs and determine how many unique paragraphs there are after "
             "removing duplicates. In other words, how many non-repeating paragraphs are there in total?\n\n"
             "{context}\n\n"
             "Please enter the final count of unique paragraphs after removing duplicates. The output format "
             "should only contain the number, such as 1, 2, 3, and so on.\n\n"
             "The final answer is: "
         )),
    Task("passage_retrieval_en", SYNTH, "retrieval", 32, "PRe", first_line=False, chat=True, samples=200, e=True,
         template=(
             "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which "
             "paragraph the abstract is from.\n\n"
             "{context}\n\n"
             "The following is an abstract.\n\n"
             "{input}\n\n"
             "Please enter the number of the paragraph that the abstract is from. The answer format must be "
             'like "Paragraph 1", "Paragraph 2", etc.\n\n'
             "The answer is: "
         )),
    Task("lcc", CODE, "code_sim", 64, "Lcc", first_line=False, chat=False, samples=500, e=True,
         template=(
             "Please complete the code given below. \n"
             "{context}Next line of code:\n"
         )),
    Task("repobench-p", CODE, "code_sim", 64, "RB-P", first_line=False, chat=False, samples=500, e=True,
         template=(
             "Please complete the code given below. \n"
             "{context}{input}Next line of code:\n"
         )),
)
# fmt: on

BY_NAME = {t.config: t for t in TASKS}
#: The 14 tasks of the GemFilter paper's Table 9.1, in its column order; "Average" is their plain mean.
PAPER_TASKS = tuple(t.config for t in TASKS[:14])
E_TASKS = tuple(t.config for t in TASKS if t.e)
ALIASES = {"all": tuple(BY_NAME), "paper": PAPER_TASKS, "e": E_TASKS}


def get_task(name: str) -> Task:
    """The task row for a config name (``qasper``; the LongBench-E name ``qasper_e`` also works)."""
    task = BY_NAME.get(name) or (BY_NAME.get(name[:-2]) if name.endswith("_e") else None)
    if task is None:
        raise ValueError(
            f"unknown LongBench task {name!r}; allowed: {', '.join(BY_NAME)} (or the aliases {', '.join(ALIASES)})"
        )
    return task


def parse_tasks(text: str | None, e: bool = False) -> tuple:
    """Task rows from a comma-separated list of configs and aliases (None: all, or all LongBench-E ones).

    Parameters: text: e.g. ``"hotpotqa,trec"``, ``"paper"``, ``"all"``; e: LongBench-E, where every
    task must have a ``_e`` variant. Returns the tasks in table order without repeats.
    """
    names = [s.strip() for s in (text or ("e" if e else "all")).split(",") if s.strip()]
    if not names:
        raise ValueError(f"--tasks is empty; give configs ({', '.join(BY_NAME)}) or an alias ({', '.join(ALIASES)})")
    chosen = set()
    for name in names:
        chosen.update(ALIASES[name] if name in ALIASES else (get_task(name).config,))
    tasks = tuple(t for t in TASKS if t.config in chosen)
    if e:
        bad = [t.config for t in tasks if not t.e]
        if bad:
            raise ValueError(f"--e: {', '.join(bad)} has no LongBench-E variant; allowed: {', '.join(E_TASKS)}")
    return tasks
