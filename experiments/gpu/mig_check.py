"""Run the launcher's MIG detection and plan against this machine's real nvidia-smi, read-only.

* parses the outputs mig_readonly.sh recorded (--raw) with petals_chain.launch.mig's parsers;
* runs the launcher's own detection (mig.probe_gpus through an nvidia-smi wrapper that refuses every
  command able to change the GPU) and its plan for a testbed that matches the GPU found
  (mig_h100.yaml / mig_h200.yaml beside this file), as ``python -m petals_chain.launch TESTBED`` does;
* runs that CLI in plan mode (never --apply), as an unprivileged user where possible.

Writes a JSON summary (--json) and prints what it found. Imports only the pure launcher modules
(numpy and pyyaml are their only third-party needs); no petals.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

# Arguments that change a GPU's state: the wrapper refuses any call that contains one of them.
MUTATING = {"-mig", "--multi-instance-gpu", "-cgi", "--create-gpu-instance", "-cci", "--create-compute-instance",
            "-dgi", "--destroy-gpu-instance", "-dci", "--destroy-compute-instance", "-r", "--gpu-reset", "-pm",
            "--persistence-mode", "-pl", "--power-limit", "-ac", "--applications-clocks", "-rac", "-lgc",
            "--lock-gpu-clocks", "-rgc", "-lmc", "-rmc", "-c", "--compute-mode", "-e", "--ecc-config", "-am",
            "--accounting-mode", "-caa", "-cab"}
TESTBEDS = {"H100-80GB": HERE / "mig_h100.yaml", "H200-141GB": HERE / "mig_h200.yaml"}


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", required=True, help="folder with mig_readonly.sh's <name>.out files")
    ap.add_argument("--json", required=True, help="summary file to write")
    args = ap.parse_args(argv)
    raw = Path(args.raw)
    summary: dict = {}
    try:
        from petals_chain.launch import mig, mig_smi
        from petals_chain.launch.__main__ import _mig_plan
        from petals_chain.launch.testbed import load_testbed
    except Exception as err:  # the launcher itself does not import: say so, keep the raw outputs
        summary["import_error"] = repr(err)
        Path(args.json).write_text(json.dumps(summary, indent=1))
        print(f"cannot import the launcher: {err!r}")
        return 1

    class ReadOnlySmi(mig_smi.NvidiaSmi):
        """nvidia-smi that refuses any state-changing command (this check must never alter the GPU)."""

        calls: list[list[str]] = []

        def __call__(self, cmd: list[str], *, check: bool = True) -> str:
            bad = MUTATING.intersection(cmd)
            if bad:
                raise mig_smi.MigError(f"read-only check refused nvidia-smi {' '.join(cmd)} ({', '.join(sorted(bad))})")
            self.calls.append(list(cmd))
            return super().__call__(cmd, check=check)

    def text(name: str) -> str:
        p = raw / f"{name}.out"
        return p.read_text() if p.exists() else ""

    parsed = {}
    for name, fn in (("query_gpu", mig_smi.parse_query_gpu), ("L", mig_smi.parse_list), ("lgip", mig_smi.parse_lgip),
                     ("lgi", mig_smi.parse_lgi), ("lci", mig_smi.parse_lci)):
        try:
            res = fn(text(name))
            parsed[name] = {"ok": True, "value": _plain(res)}
        except Exception as err:
            parsed[name] = {"ok": False, "error": repr(err)}
        print(f"parse {name}: {json.dumps(parsed[name])[:400]}")
    summary["parsed"] = parsed

    smi = ReadOnlySmi()
    gpus, why = mig.probe_gpus(smi)
    summary["probe"] = {"gpus": _plain(gpus), "why_none": why,
                        "products": [g.product.key if g.product else None for g in gpus]}
    print(f"probe_gpus: {gpus} {why!r}")
    products = [g.product.key for g in gpus if g.product] or list(TESTBEDS)
    summary["plans"] = {}
    for key in dict.fromkeys(products):
        if key not in TESTBEDS:
            continue
        tb = load_testbed(TESTBEDS[key])
        try:
            plan, note, ok = _mig_plan(tb, smi)
            summary["plans"][key] = {"testbed": str(TESTBEDS[key].relative_to(REPO)), "applicable": ok,
                                     "note": note, "setup": plan.setup_commands(),
                                     "teardown": plan.teardown_commands(), "format": mig.format_plan(plan)}
            print(f"plan for {key} ({'applicable' if ok else 'NOT applicable'}): {note}\n{mig.format_plan(plan)}")
        except Exception as err:
            summary["plans"][key] = {"error": repr(err)}
            print(f"plan for {key}: {err!r}")
    summary["smi_calls"] = smi.calls

    # the CLI in plan mode (no --apply, no --measure): as an unprivileged user where that works (then it does not
    # probe network namespaces), else as it is (plan mode changes nothing on the GPU)
    cli = []
    for key in list(summary["plans"])[:1]:
        cmd = [sys.executable, "-m", "petals_chain.launch", str(TESTBEDS[key].relative_to(REPO))]
        env = {**os.environ, "PETALS_CHAIN_LAUNCH_STATE": "/tmp/pcl-mig-check-state", "PYTHONPATH": str(REPO)}
        tries = [cmd]
        if os.geteuid() == 0 and shutil.which("setpriv"):
            tries.insert(0, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + cmd)
        for argv in tries:
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
            except (OSError, subprocess.TimeoutExpired) as err:
                cli.append({"argv": argv, "error": repr(err)})
                continue
            cli.append({"argv": argv, "rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr})
            print(f"$ {' '.join(argv)}  (exit {proc.returncode})\n{proc.stdout}{proc.stderr}")
            if proc.returncode == 0:
                break
    summary["cli"] = cli
    Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


def _plain(x):
    """Dataclasses / tuples / dicts → JSON-able values."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        d = {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
        if hasattr(x, "product"):
            d["product"] = x.product.key if x.product else None
        return d
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


if __name__ == "__main__":
    sys.exit(main())
