"""NIAH context building against hand-worked token cases (Kamradt insertion, needlehaystack 0.1.0)."""

import pytest
from niah_fixtures import ESSAYS, word_tokenizer, write_haystack

from eval.niah.haystack import (
    NEEDLE,
    build_case,
    insert_needle,
    make_haystack,
    period_token_ids,
    read_haystack,
)

P = 0  # the '.' token in the hand-built cases
CTX = [10, 11, P, 12, 13, P, 14, 15, 16, 17]  # sentence breaks after positions 2 and 5
NEEDLE_IDS = [90, 91]


@pytest.mark.parametrize(
    "depth, expected",
    [
        # ip = int(10 * .5) = 5; ctx[4] = 13, ctx[3] = 12 are not '.', ctx[2] is: insert at 3.
        (50, [10, 11, P, 90, 91, 12, 13, P, 14, 15, 16, 17]),
        # ip = 3 and ctx[2] is '.' already: no step back.
        (30, [10, 11, P, 90, 91, 12, 13, P, 14, 15, 16, 17]),
        # ip = int(10 * .9) = 9: back over 16, 15, 14 to just after the '.' at position 5.
        (90, [10, 11, P, 12, 13, P, 90, 91, 14, 15, 16, 17]),
        # ip = 6 is right after a '.'.
        (60, [10, 11, P, 12, 13, P, 90, 91, 14, 15, 16, 17]),
        # ip = 2: ctx[1] = 11 is not '.', ctx[0] neither: back to the start.
        (20, [90, 91, 10, 11, P, 12, 13, P, 14, 15, 16, 17]),
        (0, [90, 91] + CTX),
        (100, CTX + [90, 91]),  # appended, no sentence search
    ],
)
def test_insertion_backs_up_to_a_period(depth, expected):
    # target 200 + 12 leaves exactly room for 10 context + 2 needle tokens: no truncation.
    assert insert_needle(CTX, NEEDLE_IDS, depth, 212, {P}) == expected


def test_buffer_truncates_context_to_fit_the_needle():
    # target = 208 - 200 = 8 tokens: context cut to 8 - 2 = 6 tokens, needle appended at 100%.
    assert insert_needle(CTX, NEEDLE_IDS, 100, 208, {P}) == [10, 11, P, 12, 13, P, 90, 91]
    # 99%: ip = int(6 * .99) = 5; ctx[4] = 13, ctx[3] = 12 not '.', ctx[2] is: insert at 3 (the
    # '.' at position 5 is the token *at* ip, and only the one before ip counts).
    assert insert_needle(CTX, NEEDLE_IDS, 99, 208, {P}) == [10, 11, P, 90, 91, 12, 13, P]
    # A custom buffer: target = 12 - 5 = 7 -> 5 context tokens.
    assert insert_needle(CTX, NEEDLE_IDS, 100, 12, {P}, buffer=5) == [10, 11, P, 12, 13, 90, 91]


def test_any_of_several_period_ids_stops_the_search():
    ctx = [10, 7, 11, 12, 13]
    assert insert_needle(ctx, [90], 80, 206, {P, 7}) == [10, 7, 90, 11, 12, 13]  # ip 4 -> 3 -> 2
    assert insert_needle(ctx, [90], 80, 206, {P}) == [90, 10, 7, 11, 12, 13]


def test_insertion_rejects_bad_depth_and_too_short_length():
    with pytest.raises(ValueError, match=r"depth must be a percent in \[0, 100\]"):
        insert_needle(CTX, NEEDLE_IDS, 101, 212, {P})
    with pytest.raises(ValueError, match="too short.*at least the 200-token buffer plus the 2-token needle"):
        insert_needle(CTX, NEEDLE_IDS, 50, 201, {P})


def test_read_haystack_sorts_names_and_needs_txt_files(tmp_path):
    (tmp_path / "b.txt").write_text("second. ")
    (tmp_path / "a.txt").write_text("first. ")
    (tmp_path / "c.md").write_text("ignored")
    assert read_haystack(tmp_path) == "first. second. "
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .txt files"):
        read_haystack(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        read_haystack(tmp_path / "c.md")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_haystack(tmp_path / "missing")


def test_haystack_repeats_the_whole_corpus_text(tmp_path):
    tok = word_tokenizer()
    corpus = ESSAYS["a_first.txt"] + ESSAYS["b_second.txt"]  # 15 + 16 = 31 word tokens
    hay = make_haystack(tok, 232, haystack_dir=write_haystack(tmp_path))
    assert hay.text == corpus * 8  # 7 copies are 217 < 232 tokens, 8 are 248
    assert len(hay.ids) == 248
    assert tok.convert_ids_to_tokens(hay.ids[15:17]) == ["mu", "nu"]  # a_first.txt before b_second.txt


NEEDLE_WORDS = (
    "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day .".split()
)


@pytest.mark.parametrize(
    "depth, before",
    [
        (50, 4),  # 10 context tokens; ip = 5 -> 'delta' -> back to 4, after 'alpha beta gamma .'
        (95, 7),  # ip = 9 -> 'eta', 'zeta' -> back to 7, after 'delta epsilon .'
        (0, 0),
        (100, 10),
    ],
)
def test_build_case_with_a_word_tokenizer(tmp_path, depth, before):
    tok = word_tokenizer()
    # 22 needle tokens; L = 200 + 22 + 10 leaves 10 haystack tokens.
    case = build_case(tok, 232, depth, haystack_dir=write_haystack(tmp_path))
    ctx = "alpha beta gamma . delta epsilon . zeta eta theta".split()
    expected = ctx[:before] + NEEDLE_WORDS + ctx[before:]
    assert tok.convert_ids_to_tokens(tok.encode(case.context, add_special_tokens=False)) == expected
    assert case.needle_token_span == (before, before + 22)
    assert case.prompt == (
        "<|im_start|> This is a very long story book: <book> "
        + case.context
        + " </book>.\n Based on the content of the book, Question: What is the best thing to do "
        "in San Francisco?\nAnswer:"
    )
    assert case.add_special_tokens is True


def test_period_ids_are_encode_of_a_period():
    tok = word_tokenizer()
    assert period_token_ids(tok) == {tok.convert_tokens_to_ids(".")}


SIMPLE_CHAT = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
ALTERNATING_CHAT = (
    "{% for m in messages %}{% if loop.index0 > 0 and m['role'] == messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('roles must alternate') }}{% endif %}[{{ m['role'] }}]{{ m['content'] }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)
SYSTEM = "You are a helpful AI bot that answers questions for a user. Keep your response short and direct"
ASK = (
    "What is the best thing to do in San Francisco? Don't give information outside the document or repeat your findings"
)


def test_kamradt_chat_prompt(tmp_path):
    hay = write_haystack(tmp_path)
    case = build_case(word_tokenizer(SIMPLE_CHAT), 232, 50, haystack_dir=hay, template="kamradt-chat")
    assert case.prompt == f"[system]{SYSTEM}[user]{case.context}[user]{ASK}[assistant]"
    assert case.add_special_tokens is False  # the template text is the whole prompt
    # A template that wants alternating roles gets the two user turns joined by a blank line.
    case = build_case(word_tokenizer(ALTERNATING_CHAT), 232, 50, haystack_dir=hay, template="kamradt-chat")
    assert case.prompt == f"[system]{SYSTEM}[user]{case.context}\n\n{ASK}[assistant]"


def test_build_case_errors(tmp_path):
    tok = word_tokenizer()
    hay = write_haystack(tmp_path)
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template.*--prompt gemfilter"):
        build_case(tok, 232, 50, haystack_dir=hay, template="kamradt-chat")
    with pytest.raises(ValueError, match="unknown prompt template 'chat'; allowed: gemfilter, kamradt-chat"):
        build_case(tok, 232, 50, haystack_dir=hay, template="chat")
    with pytest.raises(ValueError, match="too short"):
        build_case(tok, 221, 50, haystack_dir=hay)  # 200 + 22 needed
    with pytest.raises(ValueError, match="haystack is empty"):
        build_case(tok, 232, 50, haystack="  ")
    assert NEEDLE.startswith("\nThe best thing")  # the needle the word cases spell out above
