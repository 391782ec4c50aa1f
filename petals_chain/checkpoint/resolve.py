"""A model given the way ``petals.cli.run_server`` takes it: a local checkpoint directory or a Hugging Face repository.

A repository name (``HuggingFaceTB/SmolLM2-135M-Instruct``) is looked up in the local Hugging Face cache
(``HF_HOME`` / ``HF_HUB_CACHE``); with ``HF_HUB_OFFLINE=1`` nothing is ever downloaded, and a name that is not
cached is refused with one line naming it. Servers and the orchestrator resolve the same name to the same files,
so both derive the same s_m and s_c from it (checkpoint.sizing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from petals_chain.model import SpecError

OFFLINE_VALUES = {"1", "ON", "YES", "TRUE"}
# What a server or a client needs from a repository: config, weights, tokenizer; never the whole repository.
CHECKPOINT_PATTERNS = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt")


class ModelDirError(SpecError):
    """A model directory is missing or is not a Hugging Face checkpoint PETALS can serve."""


def check_model_dir(path: str | Path) -> Path:
    """The path of a local checkpoint directory; ModelDirError naming what is missing otherwise."""
    p = Path(path)
    if not p.exists():
        raise ModelDirError(f"model directory {str(p)!r} does not exist (run scripts/prepare_model.sh, or give a path)")
    if not p.is_dir():
        raise ModelDirError(f"model path {str(p)!r} is a file, not a checkpoint directory")
    if not (p / "config.json").is_file():
        raise ModelDirError(f"model directory {str(p)!r} has no config.json: not a Hugging Face checkpoint")
    weights = list(p.glob("*.safetensors")) + list(p.glob("*.bin"))
    if not weights:
        raise ModelDirError(f"model directory {str(p)!r} has no *.safetensors or *.bin weights")
    try:
        json.loads((p / "config.json").read_text())
    except ValueError as exc:
        raise ModelDirError(f"{p / 'config.json'} is not valid JSON: {exc}") from None
    return p.resolve()


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids downloads (read now, not when huggingface_hub was imported)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in OFFLINE_VALUES


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as the environment names it now (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def looks_like_path(name: str) -> bool:
    """A name meant as a filesystem path: absolute, relative with ./ or ../, home-relative, or existing."""
    return name.startswith(("/", "./", "../", "~")) or Path(name).expanduser().exists()


def resolve_model(name_or_path: str | Path) -> Path:
    """The checkpoint directory of a local path or a Hugging Face repository name; ModelDirError naming it otherwise."""
    name = str(name_or_path).strip()
    if not name:
        raise ModelDirError("model: give a checkpoint directory or a Hugging Face repository name, got ''")
    if looks_like_path(name):
        return check_model_dir(Path(name).expanduser())
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ModelDirError(f"model {name!r} is neither a directory nor a Hugging Face repository name") from None
    offline, cache = hub_offline(), hub_cache_dir()
    try:
        path = snapshot_download(name, cache_dir=str(cache), local_files_only=offline,
                                 allow_patterns=list(CHECKPOINT_PATTERNS))
    except Exception as exc:  # huggingface_hub raises several kinds (not cached, unknown repo, no network)
        where = f"in the local Hugging Face cache {cache} (HF_HUB_OFFLINE=1)" if offline else "on the Hugging Face Hub"
        raise ModelDirError(f"model {name!r} was not found {where} ({type(exc).__name__})") from None
    return check_model_dir(path)


def model_display_name(name_or_path: str | Path) -> str:
    """The name a model goes by in the swarm: a repository name as given, a directory by its last component."""
    name = str(name_or_path).strip().rstrip("/")
    return Path(name).name if looks_like_path(name) else name


def seed_hub_cache(model_dir: str | Path, repo_id: str, cache_dir: str | Path) -> Path:
    """Make a local checkpoint findable as ``repo_id`` in a Hugging Face cache (the hub's layout, files symlinked):
    for machines that never reach the Hub, and for tests. Returns the snapshot directory."""
    import hashlib

    from huggingface_hub.utils import validate_repo_id

    validate_repo_id(repo_id)
    src = check_model_dir(model_dir)
    files = sorted(p for p in src.iterdir() if p.is_file())
    revision = hashlib.sha1("\n".join([repo_id, *(f.name for f in files)]).encode()).hexdigest()
    repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in files:
        link = snapshot / f.name
        if not link.exists():
            link.symlink_to(f)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot
