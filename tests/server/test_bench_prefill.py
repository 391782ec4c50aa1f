"""``bench server-prefill`` at a toy size: the three servers run the same prompt beside decoding sessions and the
table has one row per server; bad options are one-line errors."""

from __future__ import annotations

import pytest

from petals_chain.bench import server_prefill


def test_three_servers_one_row_each(capsys: pytest.CaptureFixture[str]) -> None:
    assert server_prefill.run(["--blocks", "2", "--sessions", "2", "--prompts", "40", "--context", "8",
                               "--chunks", "16"]) == 0
    rows = [line.split("|")[0].split() for line in capsys.readouterr().out.splitlines() if line.startswith("  2 ")]
    assert [r[2:] for r in rows] == [["petals"], ["per", "block"], ["chunked", "16"]]


def test_bad_option_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert server_prefill.run(["--chunks", "1"]) == 2
    assert capsys.readouterr().out.count("\n") == 1
