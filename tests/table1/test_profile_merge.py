"""Merging profiles of server groups: fits united, capacity by the chosen rule, mismatches refused."""

from __future__ import annotations

import pytest

from petals_chain.launch.profile_fit import Capacity, ServerFit
from petals_chain.launch.profile_merge import check_servers, merge_capacity, merge_profiles
from petals_chain.launch.profile_results import Profile
from petals_chain.model import SpecError


def _part(names, jobs_per_s, max_length=764):
    fits = {n: ServerFit(n, 0.1, 0.01, 0.001, 1e-4, 2e-3, rtt_s=0.05) for n in names}
    cap = Capacity(jobs_per_s, 64, 24, 2 * len(names), 40.0, int(40 * jobs_per_s), 3.0)
    return Profile("tb", "m", 30, max_length, fits, cap, (64, 24), "2026-01-01T00:00:00", "p")


def test_merge_unites_fits_and_takes_the_median_capacity():
    parts = [_part(["s0", "s3"], 1.0), _part(["s1"], 3.0), _part(["s2"], 2.0)]
    merged = merge_profiles(parts, "cmd")
    assert list(merged.fits) == ["s0", "s3", "s1", "s2"]
    assert merged.capacity.jobs_per_s == 2.0 and merged.command == "cmd"
    total = merge_capacity([p.capacity for p in parts], "sum")
    assert total.jobs_per_s == pytest.approx(6.0) and total.streams == 8


def test_merge_refuses_overlaps_and_mismatches():
    with pytest.raises(SpecError, match="two parts"):
        merge_profiles([_part(["s0"], 1.0), _part(["s0"], 1.0)], "c")
    with pytest.raises(SpecError, match="max_length"):
        merge_profiles([_part(["s0"], 1.0), _part(["s1"], 1.0, max_length=1527)], "c")
    with pytest.raises(SpecError, match="--capacity"):
        merge_capacity([_part(["s0"], 1.0).capacity], "mean")
    with pytest.raises(SpecError, match="no profiles"):
        merge_profiles([], "c")


def test_parts_must_be_the_testbeds_servers():
    merged = merge_profiles([_part(["s0"], 1.0), _part(["s1"], 1.0)], "c", testbed="whole")
    assert merged.testbed == "whole"
    check_servers(merged, {"s0": (0.05, 1.0), "s1": (0.05, 1.0), "s2": (0.07, 1.0)}, "tb.yaml")
    with pytest.raises(SpecError, match="tb.yaml: server s1 has RTT 60.000 ms"):
        check_servers(merged, {"s0": (0.05, 1.0), "s1": (0.06, 1.0)}, "tb.yaml")
    with pytest.raises(SpecError, match="no server s1"):
        check_servers(merged, {"s0": (0.05, 1.0)}, "tb.yaml")
