"""A testbed profile on disk: the fits and capacity (JSON), the step samples (CSV), measured-vs-model plots (PNG)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain import defaults
from petals_chain.compose.serial import fit_serial_fraction, probe_throughput
from petals_chain.launch.profile_fit import (PARAMS, BatchStep, Capacity, ProfileGrid, ServerFit, StepSample,
                                            linear_serial_fraction)
from petals_chain.model import ServerSpec, SpecError


@dataclass(frozen=True)
class Profile:
    """A profile as written to JSON: testbed, model, fits by server, the capacity and the job shape τ is given for."""

    testbed: str
    model: str
    num_blocks: int
    max_length: int
    fits: dict[str, ServerFit]
    capacity: Capacity | None
    job: tuple[int, int]
    created: str = ""
    command: str = ""

    def specs(self) -> list[ServerSpec] | None:
        """The probed servers as the model sees them for the probe's job (their τ and measured τp(b)), or None
        without a probe that names its servers."""
        cap = self.capacity
        if cap is None or not cap.servers or any(n not in self.fits for n in cap.servers):
            return None
        li, lo = cap.input_tokens, cap.output_tokens
        return [ServerSpec(n, 1.0, self.fits[n].tau_c_s(lo), self.fits[n].tau_p_s(li, lo),
                           batch_slowdown=self.fits[n].batch_slowdown) for n in cap.servers]

    def predicted_capacity(self) -> float | None:
        """The probe's throughput the model predicts from the measured τp(b) (None without curves or a probe):
        how far the load-dependent model is from the measured capacity."""
        specs = self.specs()
        if specs is None or not all(s.batch_slowdown for s in specs):
            return None
        return probe_throughput(specs, self.capacity.sessions(), self.num_blocks)

    def serial_fraction(self) -> float:
        """The part of τp the servers compute one session at a time, fitted so that the closed-loop probe's
        throughput is what mean value analysis predicts (compose/serial.py); 0 (the paper's model) without a probe
        that names its servers."""
        cap = self.capacity
        if cap is None or not cap.servers or any(n not in self.fits for n in cap.servers):
            return 0.0
        li, lo = cap.input_tokens, cap.output_tokens
        specs = [ServerSpec(n, 1.0, self.fits[n].tau_c_s(lo), self.fits[n].tau_p_s(li, lo)) for n in cap.servers]
        return fit_serial_fraction(specs, cap.sessions(), self.num_blocks, cap.jobs_per_s)

    def to_json(self) -> dict[str, Any]:
        """JSON document (fits with their τ for ``job``)."""
        li, lo = self.job
        return {"testbed": self.testbed, "model": self.model, "num_blocks": self.num_blocks,
                "max_length": self.max_length, "job": {"input_tokens": li, "output_tokens": lo},
                "created": self.created, "command": self.command,
                "servers": [{**asdict(f), "tau_p_s": f.tau_p_s(li, lo), "tau_c_s": f.tau_c_s(lo),
                             "model_tau_c_s": f.model_tau_c_s(lo),
                             "curve_serial_fraction": linear_serial_fraction(f.batch_slowdown)
                             if f.batch_slowdown else None} for f in self.fits.values()],
                "capacity": asdict(self.capacity) if self.capacity is not None else None,
                "serial_fraction": self.serial_fraction(),
                "predicted_capacity_jobs_per_s": self.predicted_capacity()}


def load_profile(path: str | Path) -> Profile:
    """Read a profile JSON written by :func:`write_outputs`; SpecError naming the file and field if malformed."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"profile file not found: {path} (python -m petals_chain.launch.profile_testbed TESTBED.yaml)")
    try:
        doc = json.loads(path.read_text())
        names = set(ServerFit.__annotations__)
        fits = {}
        for i, s in enumerate(doc["servers"]):
            kw = {k: s[k] for k in names if k in s}
            for p in PARAMS:
                v = kw.get(p)
                if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise SpecError(f"{path}: servers[{i}].{p} must be a number >= 0, got {v!r}")
            kw["batch_slowdown"] = tuple(float(g) for g in kw.get("batch_slowdown", ()))
            fits[s["name"]] = ServerFit(**kw)
        cap = None
        if doc.get("capacity"):
            cap = Capacity(**{**doc["capacity"], "servers": tuple(doc["capacity"].get("servers", ()))})
        job = (int(doc["job"]["input_tokens"]), int(doc["job"]["output_tokens"]))
        return Profile(doc["testbed"], doc["model"], int(doc["num_blocks"]), int(doc["max_length"]), fits, cap, job,
                       doc.get("created", ""), doc.get("command", ""))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError(f"{path}: not a profile written by petals_chain.launch.profile_testbed ({type(exc).__name__}: "
                        f"{exc})") from None


def write_samples_csv(path: Path, samples: Sequence[StepSample]) -> Path:
    """Every timed step as a CSV row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(StepSample.__annotations__))
        w.writeheader()
        w.writerows(asdict(s) for s in samples)
    return path


def write_batch_steps_csv(path: Path, steps: dict[str, Sequence[BatchStep]]) -> Path:
    """Every batch the servers ran during the batch probe (server, sessions, tokens, seconds): τp(b)'s evidence."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["server", "sessions", "tokens", "seconds"])
        for name, rows in steps.items():
            w.writerows([name, r.sessions, r.tokens, r.seconds] for r in rows)
    return path


def read_batch_steps_csv(path: Path) -> dict[str, list[BatchStep]]:
    """The batch probe's batches back from :func:`write_batch_steps_csv`, by server."""
    out: dict[str, list[BatchStep]] = {}
    with path.open() as fh:
        for row in csv.DictReader(fh):
            out.setdefault(row["server"], []).append(BatchStep(int(row["sessions"]), int(row["tokens"]),
                                                               float(row["seconds"])))
    return out


def read_samples_csv(path: Path) -> list[StepSample]:
    """Step samples back from :func:`write_samples_csv`."""
    types = {"server": str, "kind": str, "time_s": float}
    with path.open() as fh:
        return [StepSample(**{k: types.get(k, int)(v) for k, v in row.items()}) for row in csv.DictReader(fh)]


def job_times(samples: Sequence[StepSample]) -> dict[tuple[str, int, int, int, int], float]:
    """Total time of each measured job, keyed (server, m, l_in, l_out, repeat)."""
    out: dict[tuple[str, int, int, int, int], float] = {}
    for s in samples:
        key = (s.server, s.blocks, s.input_tokens, s.output_tokens, s.repeat)
        out[key] = out.get(key, 0.0) + s.time_s
    return out


def plot_batch_curves(path: Path, steps: dict[str, Sequence[BatchStep]], fits: dict[str, ServerFit],
                      title: str) -> Path:
    """τp(b)/τp(1) per server: every decode batch's time over the server's median alone (points), the curve the
    model uses (line), beside the paper's model (1) and a server that runs one session at a time (b)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    cmap = plt.get_cmap("tab10")
    most = 1
    for i, (name, rows) in enumerate(sorted(steps.items())):
        decode = [(r.sessions, r.seconds) for r in rows if r.tokens == r.sessions]
        alone = [t for k, t in decode if k == 1]
        curve = fits[name].batch_slowdown if name in fits else ()
        if not alone or not curve:
            continue
        base = float(np.median(alone))
        jitter = (i - len(steps) / 2) * 0.03
        ax.scatter([k + jitter for k, _ in decode], [t / base for _, t in decode], s=6, alpha=0.35, color=cmap(i))
        ax.plot(range(1, len(curve) + 1), curve, color=cmap(i), lw=1.5,
                label=f"{name} (σ of its line {linear_serial_fraction(curve):.2f})")
        most = max(most, len(curve))
    b = np.arange(1, most + 1)
    ax.plot(b, b, "k--", lw=1, label="one session at a time (PETALS' pool)")
    ax.plot(b, np.ones_like(b), "k:", lw=1, label="paper's model")
    ax.set_xlabel("sessions computed in one step (b)")
    ax.set_ylabel("step time / one session's step")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def profile_figure(samples: Sequence[StepSample], fits: dict[str, ServerFit], grid_base: tuple[int, int],
                   num_blocks: int, title: str):
    """Measured vs model, like paper Figs 9-10: computation vs blocks / input length / output length; communication
    (its legend above the bars, with room kept for it: inside the bars it covered the tallest)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    jobs = job_times(samples)
    fig, ax = plt.subplots(2, 2, figsize=(12, 8.5))
    speeds = sorted({f.speed_factor for f in fits.values()}, reverse=True)
    cmaps = [plt.get_cmap(n) for n in ("Blues", "Oranges", "Greens", "Purples")]
    colors = {}
    for si, sp in enumerate(speeds):
        group = [n for n, f in fits.items() if f.speed_factor == sp]
        for gi, n in enumerate(group):
            colors[n] = cmaps[si % len(cmaps)](0.45 + 0.5 * gi / max(1, len(group)))
    b_in, b_out = grid_base
    for name, f in fits.items():
        c = colors[name]
        # (a) computation of one job vs blocks, at the base job
        pts = [(m, t - f.tau_c_s(lo)) for (s, m, li, lo, _), t in jobs.items()
               if s == name and li == b_in and lo == b_out]
        if pts:
            ms = np.array(sorted({p[0] for p in pts}))
            ax[0, 0].scatter([p[0] for p in pts], [p[1] for p in pts], s=12, color=c)
            ax[0, 0].plot(ms, ms * f.tau_p_s(b_in, b_out), color=c, lw=1, label=f"{name} (speed {f.speed_factor:g})")
        # (b) per-block prefill computation vs input length, on all blocks
        pre = [(s.tokens, (s.time_s - f.round_trip_s - f.session_s) / s.blocks) for s in samples
               if s.server == name and s.kind == "prefill" and s.blocks == num_blocks and s.output_tokens == b_out]
        if pre:
            xs = np.array(sorted({p[0] for p in pre}))
            ax[0, 1].scatter([p[0] for p in pre], [p[1] * 1e3 for p in pre], s=12, color=c)
            ax[0, 1].plot(xs, (f.t_o_s + f.t_in_s * xs) * 1e3, color=c, lw=1)
        # (c) per-block decode computation of one job vs output length, on all blocks
        dec: dict[tuple[int, int], float] = {}
        for s in samples:
            if s.server == name and s.blocks == num_blocks and s.input_tokens == b_in and s.kind == "decode":
                key = (s.output_tokens, s.repeat)
                dec[key] = dec.get(key, 0.0) + (s.time_s - f.round_trip_s) / s.blocks
        if dec:
            xs = np.array(sorted({k[0] for k in dec}))
            ax[1, 0].scatter([k[0] for k in dec], [v * 1e3 for v in dec.values()], s=12, color=c)
            ax[1, 0].plot(xs, f.t_out_s * (xs - 1) * 1e3, color=c, lw=1)
    names = list(fits)
    x = np.arange(len(names))
    meas = [fits[n].tau_c_s(b_out) for n in names]
    model = [fits[n].model_tau_c_s(b_out) for n in names]
    ax[1, 1].bar(x - 0.2, meas, 0.4, label="measured (fit: s + l_out·r)", color="tab:blue")
    ax[1, 1].bar(x + 0.2, model, 0.4, label="model: l_out·(RTT + 18 ms)", color="tab:gray")
    ax[1, 1].set_xticks(x, names)
    ax[0, 0].set(xlabel="blocks served m", ylabel="computation of one job (s)",
                 title=f"Fig 9a: computation vs blocks (l_in={b_in}, l_out={b_out})")
    ax[0, 1].set(xlabel="input length l_in (tokens)", ylabel="prefill per block (ms)",
                 title="Fig 9b: computation vs input length (t_o + t_in·l_in)")
    ax[1, 0].set(xlabel="output length l_out (tokens)", ylabel="decode per block, whole job (ms)",
                 title="Fig 9c: computation vs output length (t_out·(l_out−1))")
    ax[1, 1].set(xlabel="server", ylabel=f"communication of one job (s), l_out={b_out}",
                 title="Fig 10: communication time per server")
    ax[0, 0].legend(fontsize=7, ncol=2)
    ax[1, 1].set_ylim(0, 1.3 * max(meas + model))
    ax[1, 1].legend(fontsize=8, loc="upper center", ncol=2)
    for a in ax.flat:
        a.grid(alpha=0.3)
    fig.suptitle(f"{title}: measured (dots/bars) vs fitted model (lines)")
    fig.tight_layout()
    return fig


def plot_profile(path: Path, samples: Sequence[StepSample], fits: dict[str, ServerFit], grid_base: tuple[int, int],
                 num_blocks: int, title: str) -> Path:
    """Draw :func:`profile_figure` to ``path``."""
    from matplotlib import pyplot as plt

    fig = profile_figure(samples, fits, grid_base, num_blocks, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def grid_base(samples: Sequence[StepSample], num_blocks: int) -> tuple[int, int]:
    """The grid's base job (l_in, l_out): the one job shape timed on fewer than all blocks (ProfileGrid.jobs)."""
    shapes = {(s.input_tokens, s.output_tokens) for s in samples if s.blocks < num_blocks}
    if len(shapes) != 1:
        raise SpecError(f"profile samples: expected one job shape on fewer than {num_blocks} blocks, got "
                        f"{sorted(shapes) or 'none'}")
    return shapes.pop()


def replot(stem: Path) -> Path:
    """STEM.png again from STEM.json and STEM_samples.csv (nothing measured, nothing else written)."""
    profile = load_profile(Path(f"{stem}.json"))
    samples = read_samples_csv(Path(f"{stem}_samples.csv"))
    return plot_profile(Path(f"{stem}.png"), samples, profile.fits, grid_base(samples, profile.num_blocks),
                        profile.num_blocks, f"profile of {profile.testbed}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m petals_chain.launch.profile_results STEM...``: redraw each STEM.png from its saved profile."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m petals_chain.launch.profile_results", description=main.__doc__)
    ap.add_argument("stems", nargs="+", type=Path, help="profile stems, e.g. results/profile/cpu-emulated")
    args = ap.parse_args(argv)
    for stem in args.stems:
        try:
            print(replot(stem))
        except (SpecError, FileNotFoundError) as exc:
            print(f"error: {stem}: {exc}", file=sys.stderr)
            return 2
    return 0


def write_outputs(out_dir: Path, stem: str, profile: Profile, samples: Sequence[StepSample], setup: Any,
                  memory: dict[str, float], grid: ProfileGrid,
                  target_load: float = defaults.TARGET_LOAD) -> dict[str, Path]:
    """Samples CSV, profile JSON, the measured-vs-model PNG and the cluster file (fitted τ for ``profile.job``)."""
    from petals_chain.launch.live_setup import FittedServer, write_cluster

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"samples": write_samples_csv(out_dir / f"{stem}_samples.csv", samples)}
    paths["json"] = out_dir / f"{stem}.json"
    paths["json"].write_text(json.dumps(profile.to_json(), indent=1))
    paths["png"] = plot_profile(out_dir / f"{stem}.png", samples, profile.fits, (grid.base_input, grid.base_output),
                                profile.num_blocks, f"profile of {profile.testbed}")
    li, lo = profile.job
    sigma = profile.serial_fraction()
    fitted = [FittedServer(n, memory[n], f.tau_p_s(li, lo), f.tau_c_s(lo), f.inference_rps, f.forward_rps, sigma,
                           f.batch_slowdown) for n, f in profile.fits.items()]
    rate = target_load * profile.capacity.jobs_per_s if profile.capacity is not None else defaults.ARRIVAL_RATE
    paths["cluster"] = write_cluster(out_dir / f"{stem}_cluster.yaml", setup, fitted, rate, target_load, profile.job)
    return paths


if __name__ == "__main__":
    raise SystemExit(main())
