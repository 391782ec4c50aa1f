"""Workloads: Poisson draws, Azure trace reading and its line-numbered validation, token-based sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import NO_DATA, data_file
from petals_chain.data.azure import TraceError, read_azure_trace
from petals_chain.sim.workloads import (
    TokenServiceModel,
    poisson_workload,
    token_sizes,
    trace_workload,
)

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
GOOD = ["2023-11-16 18:17:03.9799600,4808,10", "2023-11-16 18:17:04.0319600,3180,8",
        "2023-11-16 18:17:05.0319600,110,27"]
CODE_TRACE = data_file("azure_llm_2023_code.csv")


def write_trace(tmp_path: Path, lines: list[str]) -> Path:
    """A trace file with CRLF line ends and no newline after the last row, like the Azure files."""
    path = tmp_path / "trace.csv"
    path.write_bytes("\r\n".join(lines).encode())
    return path


def test_poisson_workload_is_reproducible_and_has_the_requested_rate() -> None:
    a = poisson_workload(3.0, 50_000, np.random.default_rng(4))
    b = poisson_workload(3.0, 50_000, np.random.default_rng(4))
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    assert abs(a.arrival_rate_per_s - 3.0) < 0.05
    assert abs(a.size.mean() - 1.0) < 0.02
    with pytest.raises(ValueError, match="arrival_rate_per_s"):
        poisson_workload(0.0, 10, np.random.default_rng(0))


def test_small_trace_is_read_in_seconds_from_the_first_request(tmp_path: Path) -> None:
    trace = read_azure_trace(write_trace(tmp_path, [HEADER, *GOOD]))
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.052, 1.052], atol=1e-9)
    assert trace.input_tokens.tolist() == [4808, 3180, 110]
    assert trace.output_tokens.tolist() == [10, 8, 27]
    half = read_azure_trace(write_trace(tmp_path, [HEADER, *GOOD]), time_scale=0.5, first_n=2)
    np.testing.assert_allclose(half.arrival_s, [0.0, 0.026], atol=1e-9)


@pytest.mark.parametrize(
    ("lines", "line_no", "message"),
    [
        (["TIMESTAMP,ContextTokens", *GOOD], 1, "GeneratedTokens"),
        ([HEADER, GOOD[0], "2023-11-16 18:17:04.0319600,3180"], 3, "expected 3 columns"),
        ([HEADER, GOOD[0], GOOD[1], "2023-11-16T18:17:05,110,27"], 4, "malformed TIMESTAMP"),
        ([HEADER, GOOD[0], "2023-13-16 18:17:04.0319600,3180,8"], 3, "malformed TIMESTAMP"),
        ([HEADER, GOOD[1], GOOD[0]], 3, "unsorted"),
        ([HEADER, GOOD[0], "2023-11-16 18:17:04.0319600,-5,8"], 3, "ContextTokens is negative"),
        ([HEADER, GOOD[0], GOOD[1], "2023-11-16 18:17:05.0319600,110,2.5"], 4, "GeneratedTokens '2.5'"),
    ],
)
def test_bad_trace_lines_are_refused_naming_the_line(tmp_path: Path, lines: list[str], line_no: int,
                                                     message: str) -> None:
    path = write_trace(tmp_path, lines)
    with pytest.raises(TraceError, match=message) as info:
        read_azure_trace(path)
    assert f"{path}:{line_no}:" in str(info.value)


@pytest.mark.skipif(CODE_TRACE is None, reason=NO_DATA)
def test_the_azure_code_trace_has_its_published_statistics() -> None:
    trace = read_azure_trace(CODE_TRACE)
    assert trace.n_jobs == 8819
    assert np.all(np.diff(trace.arrival_s) >= 0) and trace.arrival_s[0] == 0.0
    assert abs(trace.n_jobs / trace.arrival_s[-1] - 2.57) < 0.05  # README: 2.57 req/s
    assert abs(trace.input_tokens.mean() - 2048) < 60 and abs(trace.output_tokens.mean() - 28) < 2
    assert read_azure_trace(CODE_TRACE, first_n=1000).n_jobs == 1000


def test_token_sizes_and_per_chain_service_times(tmp_path: Path) -> None:
    trace = read_azure_trace(write_trace(tmp_path, [HEADER, *GOOD]))
    sizes = token_sizes(trace)
    assert sizes.mean() == pytest.approx(1.0)
    assert sizes[0] > sizes[1] > sizes[2]  # more context tokens, more prefill work
    model = TokenServiceModel(np.array([0.5, 1.0]), np.array([1e-4, 2e-4]), np.array([0.02, 0.01]))
    svc = model.service_times_s(trace)
    assert svc.shape == (3, 2)
    assert svc[0, 0] == pytest.approx(0.5 + 1e-4 * 4808 + 0.02 * 9)
    wl = trace_workload(trace, service_model=model)
    assert wl.service_s is not None and wl.n_jobs == 3
