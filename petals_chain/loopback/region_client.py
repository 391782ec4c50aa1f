"""``python -m petals_chain.loopback.region_client``: one origin's clients, run inside its network namespace.

Loads the leasing PETALS client once (orchestrator URL ``.../origins/ORIGIN``), prints ``loaded``, then for each
round waits for ``DIR/go-K.json`` ({"start_epoch": T, "by_origin": {ORIGIN: [{id, at_s, prompt, new_tokens}]}} or
{"stop": true}), starts every request at T + at_s in its own thread (greedy, exactly new_tokens), and writes
``DIR/out-K-ORIGIN.json``: per request the tokens, the servers of its chain, and its times (response = arrival to
the end of generation, waited = arrival to the lease).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any


def serve_one(model: Any, req: dict[str, Any], start_epoch: float, max_length: int) -> dict[str, Any]:
    """Wait for the request's arrival, lease, generate greedily, release; what it saw."""
    import torch

    arrival = start_epoch + float(req["at_s"])
    time.sleep(max(0.0, arrival - time.time()))
    out: dict[str, Any] = {"id": req["id"], "arrival_epoch": arrival, "tokens": None, "servers": [], "error": None}
    sess = None
    try:
        sess = model.transformer.h.open_session(max_length=max_length)
        out["lease_epoch"] = time.time()
        ids = model.generate(torch.tensor([req["prompt"]]), max_new_tokens=req["new_tokens"],
                             min_new_tokens=req["new_tokens"], do_sample=False, session=sess)
        out["tokens"] = ids[0].tolist()
    except Exception as exc:  # recorded per request; the round goes on
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if sess is not None:
            rec = sess.record
            sess.close()
            if rec is not None:
                out["servers"] = [s[0] for s in rec.spans]
                out["lease_id"] = rec.lease_id
    out["end_epoch"] = time.time()
    out["response_s"] = out["end_epoch"] - arrival
    out["waited_s"] = out.get("lease_epoch", out["end_epoch"]) - arrival
    return out


def wait_announced(model: Any, servers: int, timeout_s: float = 120.0) -> None:
    """Until ``servers`` distinct peers announce blocks in the DHT: the client's p2p then knows how to reach every
    server a lease may name (a first request straight after loading can otherwise find no route to its peer)."""
    from petals.utils.dht import get_remote_module_infos

    manager = model.transformer.h.sequence_manager
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        infos = get_remote_module_infos(manager.dht, list(manager.block_uids), latest=True)
        if len({p for info in infos if info is not None for p in info.servers}) >= servers:
            return
        time.sleep(1.0)
    raise TimeoutError(f"fewer than {servers} servers announced their blocks within {timeout_s:g} s")


def connect_servers(model: Any, servers: list[dict[str, Any]]) -> int:
    """Tell the client's p2p daemon every server's announced address (GET /servers): otherwise it knows only the
    peers its DHT lookups happened to reach, and a lease on any other server fails with "routing: not found"."""
    from hivemind.moe.client.remote_expert_worker import RemoteExpertWorker
    from hivemind.p2p import PeerID
    from hivemind.utils.multiaddr import Multiaddr

    p2p = model.transformer.h.sequence_manager.state.p2p
    n = 0
    for rec in servers:
        if rec.get("alive") and rec.get("peer_id") and rec.get("address"):
            addr = Multiaddr(rec["address"].split("/p2p/")[0])
            RemoteExpertWorker.run_coroutine(p2p._client.connect(PeerID.from_base58(rec["peer_id"]), [addr]))
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    """Load the client, then run rounds until told to stop."""
    ap = argparse.ArgumentParser(prog="python -m petals_chain.loopback.region_client", description=__doc__)
    ap.add_argument("model_dir")
    ap.add_argument("--orchestrator", required=True)
    ap.add_argument("--origin", required=True)
    ap.add_argument("--initial-peers", nargs="+", required=True)
    ap.add_argument("--dir", type=Path, required=True, help="where go-K.json appear and out-K-ORIGIN.json go")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--servers", type=int, default=1, help="wait until this many servers announce their blocks")
    args = ap.parse_args(argv)
    from petals_chain.client.model import AutoDistributedModelForCausalLM

    model = AutoDistributedModelForCausalLM.from_pretrained(
        args.model_dir, orchestrator=args.orchestrator, initial_peers=args.initial_peers, lease_timeout_s=600.0,
        lease_ttl_s=60.0, client_label=args.origin, show_route=False)
    from petals_chain.protocol.blocking import request_json

    base = args.orchestrator.split("/origins/")[0]
    wait_announced(model, args.servers)
    connect_servers(model, request_json(base + "/servers")["servers"])
    print("loaded", flush=True)
    k = 0
    while True:
        go = args.dir / f"go-{k}.json"
        while not go.exists():
            time.sleep(0.05)
        plan = json.loads(go.read_text())
        if plan.get("stop"):
            return 0
        connect_servers(model, request_json(base + "/servers")["servers"])
        results: list[dict[str, Any]] = []
        lock = threading.Lock()

        def one(req: dict[str, Any]) -> None:
            """Serve one request and keep its record."""
            rec = serve_one(model, req, plan["start_epoch"], args.max_length)
            with lock:
                results.append(rec)

        threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in plan["by_origin"].get(args.origin, [])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tmp = args.dir / f".out-{k}-{args.origin}.json"
        tmp.write_text(json.dumps(sorted(results, key=lambda r: r["id"])))
        tmp.rename(args.dir / f"out-{k}-{args.origin}.json")
        print(f"round {k} done: {len(results)} requests", flush=True)
        k += 1


if __name__ == "__main__":
    sys.exit(main())
