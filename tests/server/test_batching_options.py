"""The batching options of ``python -m petals_chain.server``: defaults from defaults.py, the config they make, and
one-line errors (exit code 2) for bad values. Parsing only: no server starts."""

from __future__ import annotations

import pytest

from petals_chain import defaults
from petals_chain.server.cli import batching_config, parse_args

BASE = ["HuggingFaceTB/SmolLM2-135M-Instruct", "--orchestrator", "http://10.0.0.1:8700", "--memory-budget", "20GB"]


def test_defaults_batch_and_come_from_defaults_py() -> None:
    cfg = batching_config(parse_args(BASE))
    assert cfg.max_sessions == defaults.MAX_BATCH_SESSIONS > 1 and cfg.enabled
    assert cfg.window_s == pytest.approx(defaults.BATCH_WINDOW_S)
    assert cfg.max_tokens == defaults.MAX_BATCH_TOKENS
    assert cfg.attention == defaults.BATCH_ATTENTION == "auto"


def test_options_reach_the_config() -> None:
    cfg = batching_config(parse_args([*BASE, "--max-batch-sessions", "1", "--batch-window-ms", "12.5",
                                      "--max-batch-tokens", "64"]))
    assert (cfg.max_sessions, cfg.window_s, cfg.max_tokens) == (1, pytest.approx(0.0125), 64)
    assert not cfg.enabled
    assert batching_config(parse_args([*BASE, "--batch-window-ms", "0"])).window_s == 0
    assert batching_config(parse_args([*BASE, "--batch-attention", "gathered"])).attention == "gathered"


@pytest.mark.parametrize("option, value", [
    ("--max-batch-sessions", "0"), ("--max-batch-sessions", "-3"), ("--max-batch-sessions", "2.5"),
    ("--max-batch-sessions", "many"), ("--batch-window-ms", "-1"), ("--batch-window-ms", "nan"),
    ("--batch-window-ms", "inf"), ("--batch-window-ms", "1e9"), ("--max-batch-tokens", "0"),
    ("--max-batch-tokens", "x"), ("--batch-attention", "paged"),
])
def test_bad_values_are_one_line_errors_with_exit_code_2(option: str, value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args([*BASE, option, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and option in err, err


def test_config_refuses_an_unknown_attention() -> None:
    from petals_chain.server.batching import BatchingConfig

    with pytest.raises(ValueError, match="attention must be one of"):
        BatchingConfig(attention="flash")
