"""The speculative width's range: how many positions one step may verify, and its check.

Torch-free and live-free, so that the orchestrator's request bodies, its width rule and the client's drafting all
check a width the same way (docs/moldable.md, "Speculative width on the swarm").
"""

from __future__ import annotations

from typing import Any

from petals_chain.model import SpecError

MAX_WIDTH = 32  # positions per step; the experiments use 1..8


class WidthError(SpecError):
    """A speculative width (positions verified per step) outside 1..MAX_WIDTH, or a bad draft setting."""


def check_width(width: Any, field_name: str = "width", max_width: int = MAX_WIDTH) -> int:
    """``width`` as an int in 1..max_width; WidthError naming the field otherwise (1 = plain greedy decoding)."""
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= max_width:
        raise WidthError(f"{field_name}: must be an integer in 1..{max_width} (positions verified per step; "
                         f"1 = plain greedy decoding), got {width!r}")
    return width
