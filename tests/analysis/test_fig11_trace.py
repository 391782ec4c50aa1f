"""Fig. 11's statistic: the std ratio against an exponential law of the same mean."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.experiments.fig11_trace import TRACE_FILE, std_ratio, chains_on_testbed
from tests.conftest import data_file


def test_std_ratio_is_one_for_exponential_and_zero_for_constant() -> None:
    rng = np.random.default_rng(3)
    assert std_ratio(rng.exponential(2.5, 200_000)) == pytest.approx(1.0, abs=0.01)
    assert std_ratio(np.full(10, 4.0)) == 0.0
    assert std_ratio(np.array([1.0, 3.0])) == pytest.approx(0.5)


@pytest.mark.data
def test_code_trace_interarrivals_are_as_bursty_as_the_paper_says() -> None:
    """The whole code trace gives the paper's 13.15; service times on the testbed's chains are all positive and
    grow with the output length (the model's per-token cost)."""
    from petals_chain.data.azure import read_azure_trace

    path = data_file(TRACE_FILE)
    if path is None:
        pytest.skip("the Azure trace is not in $PETALS_CHAIN_DATA")
    trace = read_azure_trace(path)
    assert round(std_ratio(np.diff(trace.arrival_s.astype(np.float64))), 2) == 13.15
    chains, service, _ = chains_on_testbed(trace)
    assert chains and service.shape == (trace.arrival_s.size, len(chains)) and (service > 0).all()
    order = np.argsort(trace.output_tokens, kind="stable")
    assert service[order[-1], 0] > service[order[0], 0]
