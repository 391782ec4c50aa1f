"""Fixed strings that one side writes and the other matches on: a change here must reach both sides at once."""

from __future__ import annotations

# In a 503's message: the orchestrator stops cleanly and will be back, so a client retries instead of giving up.
SHUTTING_DOWN = "shutting down"
# The reason a drained server is marked as left with ("left: " as any server that leaves); the server's next
# heartbeat reads it in the 410 it gets and stops, its sessions having moved away.
DRAINED_REASON = "left: drained"
