#!/usr/bin/env bash
# TORTA Fig 9: pass --quick for the minutes-long version, --seed S to change the seed.
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" torta-fig9 "$@"
