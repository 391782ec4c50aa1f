"""The bounds both sides of the API check: a writer stays inside them, the orchestrator refuses what is outside."""

from __future__ import annotations

from petals_chain import defaults

MAX_TIME_S = 3600.0  # a measured τp or τc above an hour is a broken measurement, not a slow server
DEFAULT_WAIT_S = defaults.LEASE_WAIT_S  # how long POST /lease waits for a chain when the body does not say
MAX_WAIT_S = 24 * 3600.0
MAX_TTL_S = 24 * 3600.0
MAX_LABEL_CHARS = 200  # free-text labels: a client's name, a server's reason for leaving
MAX_BLOCK_INDEX = 1_000_000  # no model has a million transformer blocks; the registry checks the real count
MAX_BODY_BYTES = 64 * 1024  # the largest real body (a registration) is a few hundred bytes; aiohttp answers 413 above
MAX_DEPTH = 8  # the deepest real body nests 2 levels ({"serving": {"start", "end"}}); deeper is refused before use
MAX_BATCH_SESSIONS = 4096  # a server batching more sessions per step than this is a typo
DRAIN_TIMEOUT_S = 120.0  # a drain lets the server leave after this long even if sessions are still on it
