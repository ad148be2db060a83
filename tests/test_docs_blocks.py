"""The measured-rows tests' docs reader (tests/docs_blocks.py) reads a block between its markers, note or not, and
fails naming the page and marker when a block is missing."""

import pytest
from docs_blocks import docs_block, table_lines


def test_reads_blocks_with_and_without_a_note_and_leaves_the_markers_out():
    plain = docs_block("scbench.md", "scbench-multi-request")
    noted = docs_block("scbench.md", "scbench-engine-measured")  # its opening marker carries a note
    for block in (plain, noted):
        assert "<!--" not in block and table_lines(block)
        assert all(x.startswith("| ") and not x.startswith("| method") for x in table_lines(block))


@pytest.mark.parametrize("name", ["no-such-block", "scbench-multi"])  # absent, and a prefix of a real name
def test_a_missing_block_fails_with_the_page_and_name(name):
    with pytest.raises(pytest.fail.Exception, match=rf"docs/scbench.md has no block <!-- {name} -->"):
        docs_block("scbench.md", name)
