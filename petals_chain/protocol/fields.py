"""The base models of the wire bodies and the field types they are built from.

A request body refuses keys it does not know (a misspelt ``memory_byte`` is an error, not a silently ignored field),
takes numbers only as JSON numbers (never strings or booleans) and range-checks them (finite, within the bounds of
:mod:`petals_chain.protocol.limits`). A reply ignores keys it does not know, so that an orchestrator may add one
(a regional front adds ``region`` and ``origin`` to a lease) without breaking older readers.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from petals_chain.moldable.width_range import MAX_WIDTH
from petals_chain.protocol.limits import (
    DEFAULT_WAIT_S,
    MAX_BLOCK_INDEX,
    MAX_LABEL_CHARS,
    MAX_TIME_S,
    MAX_TTL_S,
    MAX_WAIT_S,
)


class Body(BaseModel):
    """Base of every request body: unknown keys refused, numbers finite, the parsed body immutable."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


class Reply(BaseModel):
    """Base of every reply body a client reads: unknown keys ignored, the parsed reply immutable."""

    model_config = ConfigDict(extra="ignore", frozen=True)


PositiveSeconds = Annotated[StrictFloat, Field(gt=0.0, le=MAX_TIME_S, allow_inf_nan=False)]
NonNegativeSeconds = Annotated[StrictFloat, Field(ge=0.0, le=MAX_TIME_S, allow_inf_nan=False)]
WaitSeconds = Annotated[  # null: DEFAULT_WAIT_S
    StrictFloat, BeforeValidator(lambda v: DEFAULT_WAIT_S if v is None else v),
    Field(gt=0.0, le=MAX_WAIT_S, allow_inf_nan=False),
]
TtlSeconds = Annotated[StrictFloat, Field(gt=0.0, le=MAX_TTL_S, allow_inf_nan=False)]
Label = Annotated[StrictStr, Field(max_length=MAX_LABEL_CHARS)]
ServerName = Annotated[StrictStr, Field(min_length=1, max_length=128)]
Handle = Annotated[StrictStr, Field(min_length=1, max_length=512)]
BlockIndex = Annotated[StrictInt, Field(ge=0, le=MAX_BLOCK_INDEX)]
Width = Annotated[StrictInt, Field(ge=1, le=MAX_WIDTH)]
