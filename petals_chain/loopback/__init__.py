"""An orchestrated swarm on loopback (orchestrator, DHT, servers as process groups) and the live demo built on it."""
