"""Reading an aiohttp request's body as one of the wire models (:mod:`petals_chain.protocol.requests`).

Kept on the orchestrator's side, apart from :mod:`petals_chain.protocol.parsing`, so that the protocol package
does not depend on aiohttp's server half: clients and servers import it without it.
"""

from __future__ import annotations

from aiohttp import web

from petals_chain.protocol.parsing import Model, parse


async def read_body(request: web.Request, model: type[Model], *, required: bool = True) -> Model:
    """The body of an aiohttp request as ``model`` (see :func:`~petals_chain.protocol.parsing.parse`)."""
    return parse(model, await request.read(), required=required)
