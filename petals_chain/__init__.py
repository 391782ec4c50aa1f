"""petals_chain: GBP-CR block placement, GCA chain composition and JFFC dispatch for PETALS swarms.

``import petals_chain`` stays light (no torch, no petals): the live-swarm client is
loaded only when asked for, as ``from petals_chain import AutoDistributedModelForCausalLM``.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "AutoDistributedModelForCausalLM": "petals_chain.client.model",
    "use_orchestrator": "petals_chain.client.model",
}


def __getattr__(name: str) -> Any:
    """Import the PETALS-dependent exports on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'petals_chain' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Module attributes, including the lazy ones."""
    return sorted(list(globals()) + list(_LAZY))
