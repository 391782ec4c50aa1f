#!/usr/bin/env bash
# Install everything petals_chain needs into <repo>/.venv, on a machine that reaches only PyPI. Safe to rerun: when
# nothing that decides the install changed (requirements/, patches/, setup.cfg, pyproject.toml, this file, the torch
# spec) it only checks the stamp and the patches and returns in well under a second.
# Order (see docs/petals.md): torch, hivemind 1.1.12, petals --no-deps, petals' other requirements
# and ours, our patches to petals, this package (editable), a self-check.
# Usage: bash scripts/install.sh [--force] [--check]
#   --force  rerun every step even if the stamp matches      --check  run the self-check even if the stamp matches
# Env: PETALS_CHAIN_TORCH_SPEC (default torch==2.13.0, the CPU wheel served here; any other spec may pull CUDA wheels)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
REQ="$ROOT/requirements"
TORCH_SPEC="${PETALS_CHAIN_TORCH_SPEC:-torch==2.13.0}"
STAMP="$VENV/.petals_chain_install_stamp"
LOG="$VENV/install.log"
FORCE=0
CHECK=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    --check) CHECK=1 ;;
    -h|--help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument '$arg' (expected --force or --check)" >&2; exit 2 ;;
  esac
done

say() { printf '[install] %s\n' "$*"; }
die() { printf '[install] ERROR: %s\n' "$*" >&2; exit 1; }

# Runs "$@" with its output appended to $LOG; on failure shows the end of that output.
logged() {
  printf '\n$ %s\n' "$*" >>"$LOG"
  if ! "$@" >>"$LOG" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$LOG" | tail -n 25 >&2
    die "failed: $* (full log: $LOG)"
  fi
}

pip_install() { logged "$PY" -m pip install --no-input --progress-bar off "$@"; }

# Hash of everything that decides what gets installed; a change reruns the pip steps.
install_hash() {
  {
    printf '%s\n' "$TORCH_SPEC"
    cat "${BASH_SOURCE[0]}" "$ROOT/setup.cfg" "$ROOT/pyproject.toml"
    find "$REQ" "$ROOT/patches" -maxdepth 1 -type f \( -name '*.txt' -o -name '*.diff' \) -print0 | sort -z \
      | xargs -0 cat
  } | sha256sum | cut -d' ' -f1
}

site_packages() { "$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# Applies patches/*.diff to site-packages, each only if not yet applied; fails if one matches neither state.
apply_patches() {
  local site patch_file name
  site="$(site_packages)"
  shopt -s nullglob
  for patch_file in "$ROOT"/patches/*.diff; do
    name="$(basename "$patch_file")"
    if command -v patch >/dev/null 2>&1; then
      if patch --dry-run -R -p1 -s -f -d "$site" <"$patch_file" >/dev/null 2>&1; then
        [ "${1:-}" = quiet ] || say "patch $name: already applied"
      elif patch --dry-run -N -p1 -s -f -d "$site" <"$patch_file" >/dev/null 2>&1; then
        logged patch -N -p1 -f --no-backup-if-mismatch -d "$site" -i "$patch_file"
        say "patch $name: applied"
      else
        die "patch $name matches neither the original nor the patched files in $site (other petals version?)"
      fi
    else
      local result
      result="$("$PY" "$ROOT/patches/apply.py" "$site" "$patch_file" 2>&1)" || die "$result"
      case "$result" in *"already applied"*) [ "${1:-}" = quiet ] || say "$result" ;; *) say "$result" ;; esac
    fi
  done
  shopt -u nullglob
}

self_check() {
  say "self-check: import petals, petals_chain; petals client and server; run_server --help"
  logged env HF_HUB_OFFLINE=1 "$PY" -W ignore -c '
import petals, petals_chain
from petals import AutoDistributedModelForCausalLM
from petals.server.server import Server
print("petals", petals.__version__, "petals_chain", getattr(petals_chain, "__version__", "?"))'
  env HF_HUB_OFFLINE=1 "$PY" -W ignore -m petals.cli.run_server --help >/dev/null 2>>"$LOG" \
    || die "python -m petals.cli.run_server --help failed (log: $LOG)"
}

start_s=$SECONDS
command -v python3 >/dev/null || die "python3 not found (need Python >= 3.10 with venv)"
if [ ! -x "$PY" ] || ! "$PY" -c 'import sys' >/dev/null 2>&1; then
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "python3 is $(python3 -V 2>&1); need >= 3.10"
  say "creating venv $VENV ($(python3 -V 2>&1))"
  python3 -m venv "$VENV"
fi

hash="$(install_hash)"
if [ "$FORCE" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$hash" ]; then
  apply_patches quiet  # cheap; catches a petals reinstalled by hand since the stamp was written
  [ "$CHECK" = 1 ] && self_check
  say "up to date ($VENV, torch spec '$TORCH_SPEC'; --force to reinstall)"
  exit 0
fi

rm -f "$STAMP"
: >"$LOG"
say "installing into $VENV (pip output: $LOG)"
say "1/7 $TORCH_SPEC"
pip_install "$TORCH_SPEC"
say "2/7 hivemind ($(grep -v '^#' "$REQ/hivemind.txt" | xargs))"
pip_install -r "$REQ/hivemind.txt" -c "$REQ/constraints.txt" -c "$REQ/project.txt"
say "3/7 petals --no-deps ($(grep -v '^#' "$REQ/petals.txt" | xargs))"
pip_install --no-deps -r "$REQ/petals.txt"
say "4/7 petals' other requirements and ours (requirements/petals-deps.txt, project.txt, extra.txt)"
pip_install -r "$REQ/petals-deps.txt" -r "$REQ/project.txt" -r "$REQ/extra.txt" -c "$REQ/constraints.txt"
say "5/7 patches"
apply_patches
say "6/7 petals_chain (editable, --no-deps)"
pip_install --no-deps --no-build-isolation -e "$ROOT"
say "7/7 self-check"
self_check
echo "$hash" >"$STAMP"
say "done in $((SECONDS - start_s)) s"
