"""The client-side model that leases: ``AutoDistributedModelForCausalLM.from_pretrained(DIR, orchestrator=URL)``
loads a petals model and swaps in leasing subclasses at petals' plug-in points (``use_orchestrator``).

``OrchestratedRemoteSequential.inference_session`` opens a ``LeasedInferenceSession`` (client/session.py) whose
``OrchestratedSequenceManager`` (client/sequence_manager.py) routes along the lease's chain, which JFFC chose.
``model.generate()`` and ``model.inference_session()`` are unchanged for the user.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from petals.client.remote_sequential import RemoteSequential

from petals_chain import defaults
from petals_chain.client.lease import LeaseOptions
from petals_chain.client.sequence_manager import OrchestratedSequenceManager
from petals_chain.client.session import LeasedInferenceSession
from petals_chain.client.speculative import SpeculativeSession, speculative_model
from petals_chain.model import SpecError
from petals_chain.protocol.blocking import BlockingOrchestrator

log = logging.getLogger(__name__)


class OrchestratedRemoteSequential(RemoteSequential):
    """petals' RemoteSequential whose inference sessions lease a chain from the orchestrator."""

    sequence_manager: OrchestratedSequenceManager

    def _session(self, max_length: int) -> LeasedInferenceSession:
        """A new (not yet entered) leased session; a speculative one (rollback, the lease's width) with k_max."""
        options = self.sequence_manager.options
        if options.k_max is not None:
            return SpeculativeSession(self.sequence_manager, max_length, options.emulated_rtt_s)
        return LeasedInferenceSession(self.sequence_manager, max_length=max_length)

    @contextlib.contextmanager
    def inference_session(self, *, max_length: int):
        """Like petals' inference_session(max_length=...), but the session holds a lease while open."""
        with self._session(max_length) as session, self.use_session(session):
            yield session

    def open_session(self, max_length: int) -> LeasedInferenceSession:
        """A session already holding its lease but not made active: pass it to ``generate(session=...)`` and
        ``close()`` it in any order (for many concurrent sessions in one thread)."""
        return self._session(max_length).__enter__()

    def __getitem__(self, ix: int | slice) -> OrchestratedRemoteSequential:
        """A sub-sequence of blocks whose sessions still lease."""
        return OrchestratedRemoteSequential(self.config, sequence_manager=self.sequence_manager[ix])


def use_orchestrator(model: Any, orchestrator: BlockingOrchestrator, options: LeaseOptions | None = None) -> Any:
    """Make a loaded petals model lease every inference session from ``orchestrator``; returns the model."""
    transformer = model.transformer if hasattr(model, "transformer") else model
    for attr, child in list(transformer.named_children()):
        if isinstance(child, RemoteSequential):
            manager = OrchestratedSequenceManager.replacing(child.sequence_manager, orchestrator, options)
            setattr(transformer, attr, OrchestratedRemoteSequential(child.config, sequence_manager=manager))
            model.orchestrator = orchestrator
            if options is not None and options.k_max is not None and transformer is not model:
                speculative_model(model)
            return model
    raise TypeError(f"{type(model).__name__} has no petals RemoteSequential to route through the orchestrator")


def close_client(model: Any) -> None:
    """Release what a leasing model holds: its orchestrator connection, its p2p client and its DHT node
    (closing them here avoids hivemind's 'no current event loop' noise at interpreter exit)."""
    from hivemind.moe.client.remote_expert_worker import RemoteExpertWorker

    orch = getattr(model, "orchestrator", None)
    if orch is not None:
        orch.close()
    transformer = model.transformer if hasattr(model, "transformer") else model
    for child in transformer.children():
        if isinstance(child, RemoteSequential):
            manager = child.sequence_manager
            manager.shutdown()
            p2p = manager.state.p2p
            if p2p is not None:
                with contextlib.suppress(Exception):
                    RemoteExpertWorker.run_coroutine(p2p.shutdown())
            with contextlib.suppress(Exception):
                manager.dht.shutdown()


def _local_model(name_or_path: Any) -> Any:
    """A directory, checked; a repository name, as its cached snapshot when offline (the same lookup as the servers'
    and the orchestrator's), else as is for petals to fetch only what a client needs."""
    from pathlib import Path

    from petals_chain.checkpoint.resolve import hub_offline, looks_like_path, resolve_model
    from petals_chain.checkpoint.resolve import check_model_dir

    if not isinstance(name_or_path, (str, Path)):
        return name_or_path
    if looks_like_path(str(name_or_path)):
        return str(check_model_dir(Path(name_or_path).expanduser()))
    return str(resolve_model(name_or_path)) if hub_offline() else name_or_path


class AutoDistributedModelForCausalLM:
    """petals' AutoDistributedModelForCausalLM, plus ``orchestrator=URL``: sessions lease chains via JFFC."""

    @classmethod
    def from_pretrained(
        cls,
        model_name_or_path: str | None = None,
        *args: Any,
        orchestrator: str | None = None,
        orchestrator_token: str | None = None,
        lease_timeout_s: float = defaults.LEASE_WAIT_S,
        lease_ttl_s: float = defaults.LEASE_TTL_S,
        client_label: str | None = None,
        lease_options: dict[str, Any] | None = None,
        speculative_k_max: int | None = None,
        emulated_rtt_s: float = 0.0,
        **kwargs: Any,
    ) -> Any:
        """Load the client-side model. With ``orchestrator`` (its URL is all a client needs), the DHT's initial peers
        and prefix and, when no model is given, the model itself come from its ``GET /swarm``; the token defaults to the
        client credential's environment variable, then the shared one the servers read (``PETALS_CHAIN_ORCH_TOKEN``).
        ``lease_options``: more :class:`~petals_chain.client.lease.LeaseOptions` fields (how moves pick a mode).
        With ``speculative_k_max`` every lease asks for a speculative width (at most that) and ``generate()`` decodes
        greedily at the width the orchestrator chose; ``emulated_rtt_s`` delays each hop of each step (loopback)."""
        import petals

        if orchestrator is None:
            if speculative_k_max is not None:
                raise SpecError("speculative_k_max: needs orchestrator=URL (the orchestrator chooses the width)")
            if model_name_or_path is None:
                raise SpecError("give a model, or orchestrator=URL to serve the orchestrator's model")
            return petals.AutoDistributedModelForCausalLM.from_pretrained(model_name_or_path, *args, **kwargs)
        if model_name_or_path is not None:
            model_name_or_path = _local_model(model_name_or_path)
        options = LeaseOptions(lease_timeout_s, lease_ttl_s, client_label, k_max=speculative_k_max,
                               emulated_rtt_s=emulated_rtt_s, **(lease_options or {}))
        from petals_chain.protocol.auth import role_token

        orch = BlockingOrchestrator(orchestrator, token=role_token("client", orchestrator_token))
        try:
            swarm = orch.run(lambda c: c.swarm(), timeout_s=defaults.CALL_TIMEOUT_S)
            if "initial_peers" not in kwargs:
                if not swarm.get("initial_peers"):
                    raise SpecError(f"the orchestrator at {orchestrator} runs no DHT; pass initial_peers=[...]")
                kwargs["initial_peers"] = swarm["initial_peers"]
            if "dht_prefix" not in kwargs and swarm.get("dht_prefix"):
                kwargs["dht_prefix"] = swarm["dht_prefix"]
            served = swarm.get("model") or {}
            if model_name_or_path is None:
                model_name_or_path = served.get("source")
                if not model_name_or_path:
                    raise SpecError(f"the orchestrator at {orchestrator} serves {served.get('name')!r} without saying "
                                    "where it comes from (no --model there): pass the model directory or repository")
                model_name_or_path = _local_model(model_name_or_path)  # a directory must exist on this machine too
            model = _join_swarm(lambda: petals.AutoDistributedModelForCausalLM.from_pretrained(
                model_name_or_path, *args, **kwargs))
            expected = served.get("num_blocks")
            if expected is not None and model.config.num_hidden_layers != expected:
                raise SpecError(f"{model_name_or_path} has {model.config.num_hidden_layers} blocks but the "
                                f"orchestrator composes for {expected}")
            return use_orchestrator(model, orch, options)
        except BaseException:
            orch.close()
            raise


def _join_swarm(load: Any, attempts: int = defaults.DHT_JOIN_ATTEMPTS) -> Any:
    """Run ``load`` (which starts the client's DHT node), retrying a bootstrap that no initial peer answered: on a
    busy machine or network the first pings can time out although the swarm is up (the orchestrator vouched for it)."""
    for attempt in range(1, attempts + 1):
        try:
            return load()
        except RuntimeError as exc:
            if "bootstrap failed" not in str(exc) or attempt == attempts:
                raise
            log.warning("joining the swarm's DHT failed (%s); try %d of %d", exc, attempt + 1, attempts)
            time.sleep(2.0 * attempt)
    raise AssertionError("unreachable")
