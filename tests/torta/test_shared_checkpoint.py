"""Every TORTA figure finds the shared evaluation's checkpoint: one training per (topology, seed) serves Figs 8-12
and the PPO ablation (torta_common.shared_evaluation), so whichever of them runs a full setting must name the same
results/resume/ file; before, each figure's own entry module was part of the key and each would have retrained."""

from __future__ import annotations

import subprocess
import sys

import pytest

from petals_chain.experiments.common import REPO

PROBE = """
import sys
from types import SimpleNamespace
from petals_chain.experiments import load
from petals_chain.experiments.common import checkpoint_path
load(sys.argv[1])
print(checkpoint_path("torta-eval-abilene", SimpleNamespace(quick=False, seed=1),
                      "petals_chain.experiments.torta_common").name)
"""


def _key(experiment: str) -> str:
    """The checkpoint file a fresh process running ``experiment`` would use (only that experiment imported)."""
    out = subprocess.run([sys.executable, "-c", PROBE, experiment], cwd=REPO, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def fig8_key() -> str:
    key = _key("torta-fig8")
    assert key.startswith("torta-eval-abilene-seed1-") and key.endswith(".jsonl")
    return key


# torta-fig9 imports torta-fig8's module; torta-trust has its own (fig10-12 are like either)
@pytest.mark.parametrize("experiment", ["torta-fig9", "torta-trust"])
def test_every_torta_figure_names_the_checkpoint_torta_fig8_names(experiment: str, fig8_key: str) -> None:
    assert _key(experiment) == fig8_key
