"""Size classes, GPU capacities from the models' real KV sizes, and the workload builders."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.mell.classes import (A100_40GB, LLAMA2_7B, LLAMA2_13B, RTX_4090, SizeClass, kv_capacity_tokens,
                                       size_class)
from petals_chain.mell.workloads import Lengths, build_workload, poisson_arrivals, sharegpt_lengths


def test_class_boundaries_belong_to_the_smaller_class():
    C = 2400
    assert size_class(2400, C) == SizeClass.L and size_class(1201, C) == SizeClass.L
    assert size_class(1200, C) == SizeClass.M and size_class(801, C) == SizeClass.M
    assert size_class(800, C) == SizeClass.S and size_class(601, C) == SizeClass.S
    assert size_class(600, C) == SizeClass.T and size_class(301, C) == SizeClass.T
    assert size_class(300, C) == SizeClass.X and size_class(1, C) == SizeClass.X


def test_kv_sizes_and_capacities():
    assert LLAMA2_7B.kv_bytes_per_token == 524_288 and LLAMA2_13B.kv_bytes_per_token == 819_200
    c7, c13 = kv_capacity_tokens(LLAMA2_7B, RTX_4090), kv_capacity_tokens(LLAMA2_13B, A100_40GB)
    assert 20_000 < c7 < 25_000 and 18_000 < c13 < 22_000
    # the paper: a 4096-token 13B request is about 3.2 GB; the A100 holds about five of them
    assert c13 // 4096 == 5


def test_capacity_bad_input():
    with pytest.raises(ValueError, match="memory_fraction"):
        kv_capacity_tokens(LLAMA2_7B, RTX_4090, memory_fraction=0)
    with pytest.raises(ValueError, match="no room"):
        kv_capacity_tokens(LLAMA2_13B, RTX_4090)


def test_build_workload_scales_and_caps():
    rng = np.random.default_rng(0)
    lengths = Lengths(np.array([10, 500]), np.array([20, 900]), "t")
    wl = build_workload(np.arange(2.0), lengths, 8000, rng, scale=10, sample=False)
    assert wl.prompt_tokens.tolist() == [100, 5000] and wl.output_tokens.tolist() == [200, 3000]
    with pytest.raises(ValueError, match="scale"):
        build_workload(np.arange(2.0), lengths, 8000, rng, scale=0)
    with pytest.raises(ValueError, match="mean_gap_s"):
        poisson_arrivals(0, 5, rng)


def test_sharegpt_copy_is_read_up_to_its_cut():
    lengths = sharegpt_lengths()
    assert 15_000 < lengths.prompt_tokens.size < 20_000  # whole records before the truncation
    assert "truncated" in lengths.source
    assert 100 < lengths.prompt_tokens.mean() < 400 and 200 < lengths.output_tokens.mean() < 500


@pytest.mark.data
def test_azure_arrivals_stretch_to_the_asked_gap():
    from petals_chain.mell.workloads import azure_arrivals

    t = azure_arrivals(500, 0.8)
    assert t[0] == 0 and np.all(np.diff(t) >= 0)
    assert np.isclose(t[-1] / 499, 0.8)
