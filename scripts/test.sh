#!/usr/bin/env bash
# Install if needed, then lint (ruff) and run the tests (pytest) in the project venv. Extra arguments go to pytest,
# e.g. `bash scripts/test.sh tests/dispatch/test_jffc.py -k capacity` or `bash scripts/test.sh -m "not live"`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install.sh
PY="$ROOT/.venv/bin/python"

# No internet here: never let transformers/huggingface_hub wait on the hub; draw plots without a display.
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}" MPLBACKEND="${MPLBACKEND:-Agg}"
# The external data (Azure traces, RIPE Atlas RTTs) come from $PETALS_CHAIN_DATA; tests that read them are skipped,
# with that reason, when it is unset.
[ -n "${PETALS_CHAIN_DATA:-}" ] || echo "[test] PETALS_CHAIN_DATA is not set: tests that read the Azure traces or RIPE Atlas skip"

lint_dirs=()
for d in petals_chain tests experiments scripts; do [ -d "$d" ] && lint_dirs+=("$d"); done
# Both always run, so one report shows lint and test failures together; the exit code is non-zero if either failed.
set +e
echo "[test] ruff check ${lint_dirs[*]}"
"$PY" -m ruff check "${lint_dirs[@]}"
ruff_rc=$?
echo "[test] pytest -q $*"
"$PY" -m pytest -q "$@"
pytest_rc=$?
set -e
# pytest exits 5 when it collected nothing; that is only acceptable while the repo has no test files at all.
if [ "$pytest_rc" = 5 ] && [ -z "$(find tests -name 'test_*.py' -print -quit 2>/dev/null)" ]; then
  echo "[test] no test files under tests/ yet"
  pytest_rc=0
fi
if [ "$ruff_rc" != 0 ]; then
  echo "[test] FAILED: ruff check found problems (exit $ruff_rc)" >&2
  exit "$ruff_rc"
fi
exit "$pytest_rc"
