#!/usr/bin/env bash
# TORTA live: 3 regions of SmolLM2 servers, 2 origins behind emulated delays (root); --quick for a shorter replay.
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" torta-live "$@"
