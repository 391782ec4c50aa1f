"""What every live method starts from: the checkpoint's exact sizes and the servers' fitted figures.

:class:`ModelSetup` is the model as every process must see it (the static job length its cache
slots are sized for, s_m and s_c in bytes); :class:`FittedServer` holds a server's τp/τc fitted by
the profiler, which :func:`write_cluster` writes as the cluster file the orchestrator composes with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from petals_chain.launch.testbed import Testbed, TestbedError
from petals_chain.model import ModelSpec, ServerSpec

DEFAULT_DTYPE = "float32"


@dataclass(frozen=True)
class ModelSetup:
    """The checkpoint, its dtype, the static job length its cache slots are sized for, and the exact sizes."""

    model_dir: Path
    name: str
    dtype: str
    max_length: int
    block_bytes: int
    cache_bytes: int
    num_blocks: int
    hidden_size: int

    @property
    def spec(self) -> ModelSpec:
        """The ModelSpec the orchestrator and the composers use (exactly the servers' s_m and s_c)."""
        return ModelSpec(self.num_blocks, float(self.block_bytes), float(self.cache_bytes), self.name)

    @property
    def dht_prefix(self) -> str:
        """PETALS DHT prefix of the model (PETALS' delimiters replaced)."""
        return self.name.replace(".", "-").replace(" ", "-")


def model_setup(testbed: Testbed, model_dir: str | Path | None = None, dtype: str = DEFAULT_DTYPE) -> ModelSetup:
    """Sizes of the testbed's checkpoint; the job length is the testbed's s_c in tokens of this checkpoint."""
    from petals_chain.checkpoint.resolve import check_model_dir
    from petals_chain.checkpoint.sizing import block_sizes, load_config

    path = model_dir or testbed.model_path
    if path is None:
        raise TestbedError(f"{testbed.source or testbed.name}: model.path is needed to run servers")
    directory = check_model_dir(path)
    config = load_config(directory)
    groups = getattr(config, "num_key_value_groups", 1) or 1
    per_token = 2 * config.hidden_size // groups * (4 if dtype == "float32" else 2)
    if testbed.emulated:  # sizes in the emulated model's units; the checkpoint only computes (device_profile)
        from petals_chain.device_profile import emulated_sizes

        per_token = emulated_sizes(1)[1]
    max_length = int(testbed.model.cache_bytes // per_token)
    if max_length < 2:
        raise TestbedError(f"{testbed.source or testbed.name}: model.cache_size {testbed.model.cache_bytes:g} B holds "
                           f"{max_length} tokens of this checkpoint ({per_token} B per token): too small")
    sizes = block_sizes(directory, dtype, max_length)
    if sizes.num_blocks != testbed.model.num_blocks:
        raise TestbedError(f"{testbed.source or testbed.name}: model.blocks = {testbed.model.num_blocks} but "
                           f"{directory} has {sizes.num_blocks} blocks")
    block_bytes, cache_bytes = sizes.block_bytes, sizes.cache_bytes
    if testbed.emulated:
        block_bytes, cache_bytes = emulated_sizes(max_length)
    return ModelSetup(directory, testbed.model.name, dtype, max_length, block_bytes, cache_bytes,
                      sizes.num_blocks, int(config.hidden_size))


@dataclass(frozen=True)
class FittedServer:
    """A server's fitted figures for the replay's mean job: τp per block, τc, and per-block speeds for PETALS."""

    name: str
    memory_bytes: float
    tau_p_s: float
    tau_c_s: float
    inference_rps: float  # decode steps per second per block (1 / t_out)
    forward_rps: float  # prefill tokens per second per block (1 / t_in)
    serial_fraction: float = 0.0  # fitted from the closed-loop probe (compose/serial.py)
    batch_slowdown: tuple[float, ...] = ()  # τp(b)/τp(1) measured by the batch probe; overrides σ where given

    @property
    def spec(self) -> ServerSpec:
        """The ServerSpec the composers see."""
        return ServerSpec(self.name, self.memory_bytes, self.tau_c_s, self.tau_p_s, self.serial_fraction,
                          self.batch_slowdown)


def write_cluster(path: Path, setup: ModelSetup, servers: Sequence[FittedServer], arrival_rate: float,
                  target_load: float, job: tuple[int, int]) -> Path:
    """A cluster file (``petals_chain compose`` format) with the fitted τ: what the orchestrator composes with."""
    import yaml

    doc = {
        "model": {"name": setup.name, "blocks": setup.num_blocks, "block_gb": setup.block_bytes / 1e9,
                  "cache_gb": setup.cache_bytes / 1e9},
        "load": {"arrival_rate": float(arrival_rate), "target_load": float(target_load)},
        "workload": {"input_tokens": int(job[0]), "output_tokens": int(job[1])},
        "servers": [{"name": s.name, "memory_gb": s.memory_bytes / 1e9, "tau_c_s": float(s.tau_c_s),
                     "tau_p_s": float(s.tau_p_s), "serial_fraction": float(s.serial_fraction),
                     **({"batch_slowdown": [float(g) for g in s.batch_slowdown]} if s.batch_slowdown else {})}
                    for s in servers],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by petals_chain.launch.profile_live: tau_p_s / tau_c_s fitted on the live testbed\n"
                    + yaml.safe_dump(doc, sort_keys=False))
    return path
