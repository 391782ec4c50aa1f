"""Tests of the loopback demo and swarm helpers that need no live swarm."""
