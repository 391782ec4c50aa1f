"""Tests of the orchestrated PETALS server command line."""
