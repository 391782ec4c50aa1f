"""One way to write a block span: the paper's 1-indexed a_j, m_j become PETALS' 0-indexed, end-exclusive start:end."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.model import Chain, Placement, SpecError, petals_span, span_json, span_text


def test_petals_span_shifts_the_first_block_and_keeps_the_count():
    assert petals_span(1, 15) == (0, 15)  # the paper's blocks 1..15 are petals' --block_indices 0:15
    assert petals_span(16, 15) == (15, 30)
    assert petals_span(3, 1) == (2, 3)
    assert petals_span(0, 0) == (0, 0)  # a server that holds nothing
    assert petals_span(np.int64(2), np.int64(2)) == (1, 3) and type(petals_span(np.int64(2), 2)[0]) is int


def test_text_and_json_forms():
    assert span_text(0, 15) == "0:15"
    assert span_json(15, 30) == {"start": 15, "end": 30}
    assert span_text(np.int64(2), np.int64(4)) == "2:4"


@pytest.mark.parametrize("args, needle", [((-1, 3), "start <= end"), ((4, 3), "start <= end"),
                                          ((0.5, 3), "'start'"), ((0, True), "'end'"), ((0, "3"), "'end'")])
def test_bad_spans_name_the_field(args, needle):
    with pytest.raises(SpecError, match=needle):
        span_text(*args)
    with pytest.raises(SpecError, match=needle):
        span_json(*args)


def test_bad_paper_blocks_are_refused():
    with pytest.raises(SpecError, match="first_block"):
        petals_span(0, 2)
    with pytest.raises(SpecError, match="num_blocks"):
        petals_span(1, -1)


def test_placement_and_chain_spans_tile_the_model():
    placement = Placement(first_block=(1, 2, 1, 0), num_blocks=(2, 3, 4, 0))
    assert [placement.span(j) for j in range(4)] == [(0, 2), (1, 4), (0, 4), (0, 0)]
    chain = Chain(servers=(0, 1), blocks=(2, 2), capacity=1, service_time_s=1.0)
    # server 1 holds 1:4 but processes only the blocks server 0 has not: 2:4
    assert chain.petals_spans() == [(0, 0, 2), (1, 2, 4)]
    assert Chain((2,), (4,), 1, 1.0).petals_spans() == [(2, 0, 4)]
