"""A live swarm with client, server and operator credentials: the probe's attacks and a fuzzer change nothing.

One swarm of the tiny random LLaMA (the fixtures of tests/live/test_swarm.py): orchestrator with its DHT and two
servers, each role with its own token. Registrations are believed only from the DHT (the orchestrator's default with
a DHT): an invented peer id stays out of the composition and is buried, a real server's peer id claimed by another
name is refused, a spoofed heartbeat is a 403, a false failure report leaves capacity intact and the 4th by one
request is a 429 while another client's report from the same host is still answered.
Then a seeded fuzzer sends malformed, oversized, wrongly typed and out-of-order requests to every route while a
generation runs: every answer is a 4xx with a JSON message, the lease held meanwhile renews, the registrations are
unchanged and the generated tokens equal local greedy decoding.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from petals_chain.loopback.swarm import LocalSwarm, ServerPlan
from tests.live import test_swarm
from tests.live.test_swarm import MAX_LENGTH, _wait_for

pytestmark = pytest.mark.live

tiny_dir = test_swarm.tiny_dir
reference = test_swarm.reference
TOKENS = {"client": "live-client-token", "server": "live-server-token", "operator": "live-operator-token"}
ENV = {"PETALS_CHAIN_CLIENT_TOKEN": TOKENS["client"], "PETALS_CHAIN_SERVER_TOKEN": TOKENS["server"],
       "PETALS_CHAIN_OPERATOR_TOKEN": TOKENS["operator"]}
VERIFY_TIMEOUT_S = 6.0
SERVERS = [ServerPlan("s1", "3MB"), ServerPlan("s2", "3MB")]  # two whole-model servers: two chains, a short start
INVENTED_PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"  # a well-formed peer id that no one here holds


@contextlib.contextmanager
def role_tokens_in_env() -> Iterator[None]:
    """Every role's token in this process's environment (which the swarm's processes inherit), the shared
    ``PETALS_CHAIN_ORCH_TOKEN`` removed; the environment as it was afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in ENV.items():
            mp.setenv(key, value)
        mp.delenv("PETALS_CHAIN_ORCH_TOKEN", raising=False)
        yield


@pytest.fixture(scope="module")
def swarm(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Orchestrator + DHT + 2 servers, with a token per role (given to every process through its environment)."""
    with role_tokens_in_env():
        sw = LocalSwarm(tiny_dir, SERVERS, log_dir=tmp_path_factory.mktemp("trust-logs"), model_name="tiny-llama",
                        max_length=MAX_LENGTH, arrival_rate=4.0, c=1, lease_ttl_s=20.0, heartbeat_timeout_s=15.0,
                        orchestrator_extra=("--verify-timeout", str(VERIFY_TIMEOUT_S)), api_token=TOKENS["operator"])
        try:
            sw.start(timeout_s=240)
            yield sw
        finally:
            sw.stop()


@pytest.fixture(scope="module")
def model(swarm: LocalSwarm, tiny_dir: Path):
    """The leasing PETALS client (its token from $PETALS_CHAIN_CLIENT_TOKEN)."""
    from petals_chain import AutoDistributedModelForCausalLM

    m = AutoDistributedModelForCausalLM.from_pretrained(str(tiny_dir), orchestrator=swarm.url, lease_timeout_s=120.0,
                                                       lease_ttl_s=20.0, max_retries=2, client_label="model")
    yield m
    m.orchestrator.close()


def call(swarm: LocalSwarm, method: str, path: str, body: Any = None, token: str | None = None,
         raw: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any, str]:
    """One request → (status, parsed JSON or None, content type); never raises on an HTTP error status."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    h = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(swarm.url + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, text, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        status, text, ctype = err.code, err.read(), err.headers.get("Content-Type", "")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return status, parsed, ctype


def _servers(swarm: LocalSwarm) -> dict[str, dict]:
    """GET /servers by name."""
    return {r["name"]: r for r in swarm.get("/servers")["servers"]}


def _spans(swarm: LocalSwarm) -> dict[str, tuple[int, int]]:
    """Each live planned server's assigned span."""
    return {n: (r["assignment"]["start"], r["assignment"]["end"]) for n, r in _servers(swarm).items()
            if r["alive"] and n in {p.name for p in SERVERS}}


class CapacityWatch:
    """Samples the offered capacity in a thread; ``low`` is the smallest seen."""

    def __init__(self, swarm: LocalSwarm) -> None:
        self.swarm, self.low, self.samples = swarm, None, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            cap = self.swarm.get("/health")["capacity"]
            self.low = cap if self.low is None else min(self.low, cap)
            self.samples += 1

    def stop(self) -> int:
        """Stop sampling; the lowest capacity seen."""
        self._stop.set()
        self._t.join(5)
        return self.low


def test_servers_are_believed_from_the_dht_and_serve_greedy_tokens(swarm: LocalSwarm, model, reference) -> None:
    """Every server was seen in the DHT (none pending), every composed chain is offered, output equals greedy."""
    recs = _servers(swarm)
    assert all(r["alive"] and r["pending"] is None for r in recs.values()), recs
    h = swarm.get("/health")
    assert h["chains"] == h["chains_composed"] >= 2 and h["capacity"] >= 2
    prompt = [1, 5, 17, 42]
    out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0].tolist()
    assert out == reference(prompt, 8)


def test_probe_attacks_change_nothing(swarm: LocalSwarm, model) -> None:
    """Invented peer id, a real peer id under another name, a spoofed heartbeat, false failure reports: capacity and
    assignments stay as they were throughout."""
    before, capacity = _spans(swarm), swarm.get("/health")["capacity"]
    watch = CapacityWatch(swarm)
    s = TOKENS["server"]

    ghost = {"name": "ghost", "memory_bytes": 50e6, "tau_p_s": 1e-4, "tau_c_s": 0.0, "peer_id": INVENTED_PEER,
             "max_batch_sessions": 16}
    status, reply, _ = call(swarm, "POST", "/servers/register", ghost, s)
    assert status == 200 and reply["server"]["pending"] and reply["assignment"]["num_blocks"] == 0
    real = _servers(swarm)["s1"]
    impostor = {"name": "impostor", "memory_bytes": 50e6, "tau_p_s": 1e-4, "tau_c_s": 0.0, "peer_id": real["peer_id"],
                "max_batch_sessions": 16}
    status, reply, _ = call(swarm, "POST", "/servers/register", impostor, s)
    assert status == 409 and "belongs to server 's1'" in reply["error"]

    spoof = {"name": "s1", "serving": {"start": 0, "end": 0}}
    for token in (s, TOKENS["client"], TOKENS["operator"], None):
        status, _, _ = call(swarm, "POST", "/servers/heartbeat", spoof, token)
        assert status in (401, 403), (token, status)

    # false failure reports: each answered by a replacement lease, the accused server stays; the 4th by the same
    # request is refused. The reporter sends no label (the default client), as the issue-23 probe did.
    status, lease, _ = call(swarm, "POST", "/lease", {"timeout_s": 60}, TOKENS["client"])
    assert status == 200
    for i in range(4):
        accused = lease["spans"][0]["server"]
        status, reply, _ = call(swarm, "POST", f"/lease/{lease['lease_id']}/report-failure",
                                {"server": accused, "timeout_s": 60}, TOKENS["client"])
        if i < 3:
            assert status == 200 and reply["replaces"] == lease["lease_id"], reply
            lease = reply
            assert _servers(swarm)[accused]["alive"]
        else:
            assert status == 429 and "false failure reports" in reply["error"], reply
    # another client on the same host, also without a label, is not silenced by the first one's reports (issue 23)
    status, other, _ = call(swarm, "POST", "/lease", {"timeout_s": 60}, TOKENS["client"])
    assert status == 200
    status, reply, _ = call(swarm, "POST", f"/lease/{other['lease_id']}/report-failure",
                            {"server": other["spans"][0]["server"], "timeout_s": 60}, TOKENS["client"])
    assert status == 200 and reply["replaces"] == other["lease_id"], reply
    for held in (lease, reply):
        assert call(swarm, "POST", f"/lease/{held['lease_id']}/release", {}, TOKENS["client"])[0] == 200

    _wait_for(lambda: not _servers(swarm)["ghost"]["alive"], VERIFY_TIMEOUT_S + 20, "the invented peer buried")
    assert "never answered" in _servers(swarm)["ghost"]["dead_reason"]
    low = watch.stop()
    assert watch.samples > 5 and low == capacity, (low, capacity)
    assert _spans(swarm) == before
    assert "impostor" not in _servers(swarm)


# ---- the fuzzer -------------------------------------------------------------------------------------------------

VIEWS = {"metrics", "chains", "queue", "servers"}  # GET routes: only a wrong credential makes them fail
NUMERIC = {"/servers/register": ["memory_bytes", "tau_p_s", "tau_c_s"], "/servers/heartbeat": ["tau_p_s", "tau_c_s"],
           "/lease": ["timeout_s", "ttl_s"], "renew": ["ttl_s"], "report-failure": ["timeout_s", "ttl_s"]}
BAD_VALUES: list[Any] = ["12", [], {}, True, -1, 10**400, -(10**400), 1e300, "NaN"]  # wrong for every number


def _bad_body(rng: np.random.Generator, kind: str, base: dict[str, Any]) -> bytes:
    """One invalid body for a route whose valid body looks like ``base`` (each choice invalid by construction)."""
    choice = int(rng.integers(8))
    if choice == 0:
        return [b"{", b"\xff\xfe\x00", b"[]", b"42", b'"x"', b"{\"a\":}", b"nul"][int(rng.integers(7))]
    if choice == 1:
        depth = int(rng.integers(9, 200))
        return json.dumps({**base, "x": 0})[:-1].encode() + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
    if choice == 2:
        return json.dumps({**base, "pad": "x" * int(rng.integers(70_000, 120_000))}).encode()
    if choice == 3:
        field = str(rng.choice(NUMERIC.get(kind, ["timeout_s"])))
        literal = ["NaN", "Infinity", "-Infinity", "1e999"][int(rng.integers(4))]
        rest = json.dumps({k: v for k, v in base.items() if k != field})[1:-1]
        return ("{" + (rest + ", " if rest else "") + f'"{field}": {literal}' + "}").encode()
    if choice == 4:
        field = str(rng.choice(NUMERIC.get(kind, ["timeout_s"])))
        return json.dumps({**base, field: BAD_VALUES[int(rng.integers(len(BAD_VALUES)))]}).encode()
    if choice == 5:
        return json.dumps({**base, "bogus_" + str(int(rng.integers(100))): 1}).encode()
    if choice == 6:
        return json.dumps({k: v for k, v in base.items() if k != next(iter(base), None)} | {"extra": None}).encode()
    return json.dumps([base]).encode()


def test_fuzzed_requests_are_4xx_with_json_and_change_nothing(swarm: LocalSwarm, model, reference) -> None:
    """Seeded malformed/oversized/wrongly typed/out-of-order requests to every route while a generation runs."""
    rng = np.random.default_rng(12)
    c, s, o = TOKENS["client"], TOKENS["server"], TOKENS["operator"]
    before = _spans(swarm)
    status, held, _ = call(swarm, "POST", "/lease", {"timeout_s": 60, "client": "holder"}, c)
    assert status == 200
    fz = {"name": "fz", "memory_bytes": 50e6, "tau_p_s": 0.1, "tau_c_s": 0.0, "peer_id": INVENTED_PEER,
          "max_batch_sessions": 16}
    status, reply, _ = call(swarm, "POST", "/servers/register", fz, s)
    assert status == 200
    fz_secret = reply["secret"]
    done_lease = call(swarm, "POST", "/lease", {"timeout_s": 60, "client": "done"}, c)[1]
    assert call(swarm, "POST", f"/lease/{done_lease['lease_id']}/release", {}, c)[0] == 200

    result: dict[str, Any] = {}
    prompt = [1, 9, 8, 7, 6, 5]

    def generate() -> None:
        out = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
        result["tokens"] = out[0].tolist()

    gen = threading.Thread(target=generate, daemon=True)
    gen.start()
    bad_names = ["no-such-server", "x" * 300, "..", "%C3%BC", "a%20b", "s1%00"]
    bad_leases = ["nope", "L0-ffffffffffff", done_lease["lease_id"], "%2e%2e", "y" * 3000]
    routes: list[tuple[str, str, str, dict[str, Any], str | None]] = [
        ("POST", "/servers/register", "/servers/register", {"name": "fz2", "memory_bytes": 50e6, "tau_p_s": 0.1,
                                                            "tau_c_s": 0.0, "peer_id": INVENTED_PEER,
                                                            "max_batch_sessions": 16}, s),
        ("POST", "/servers/heartbeat", "/servers/heartbeat", {"name": "fz", "serving": {"start": 0, "end": 0}},
         fz_secret),
        ("POST", "/servers/{name}/leave", "leave", {"reason": "x"}, None),
        ("POST", "/servers/{name}/evict", "evict", {"reason": "x"}, o),
        ("POST", "/servers/{name}/cordon", "cordon", {"reason": "x"}, o),
        ("POST", "/servers/{name}/drain", "drain", {"timeout_s": 1.0}, o),
        ("GET", "/servers/{name}/assignment", "assignment", {}, o),
        ("POST", "/lease", "/lease", {"timeout_s": 1.0}, c),
        ("POST", "/lease/{id}/renew", "renew", {"ttl_s": 10.0}, c),
        ("POST", "/lease/{id}/release", "release", {}, c),
        ("POST", "/lease/{id}/report-failure", "report-failure", {"server": "s1", "timeout_s": 1.0}, c),
        ("GET", "/metrics", "metrics", {}, None), ("GET", "/chains", "chains", {}, None),
        ("GET", "/queue", "queue", {}, s), ("GET", "/servers", "servers", {}, None),
        ("DELETE", "/lease", "method", {}, c), ("GET", "/no/such/route", "route", {}, c),
    ]
    answers: list[tuple[str, str, int, Any, str]] = []
    sent, renewed_s = 0, time.monotonic()
    while sent < 250 or gen.is_alive():
        if time.monotonic() - renewed_s > 5.0:  # the holder renews as a real client does (TTL 20 s)
            assert call(swarm, "POST", f"/lease/{held['lease_id']}/renew", {}, c)[0] == 200
            renewed_s = time.monotonic()
        method, template, kind, base, token = routes[int(rng.integers(len(routes)))]
        path = template.replace("{name}", str(rng.choice(bad_names))).replace("{id}", str(rng.choice(bad_leases)))
        if rng.random() < 0.15:  # a wrong or missing credential instead of the right one
            wrong = [None, "forged"] if kind in VIEWS else [None, "forged", fz_secret if token != fz_secret else c]
            token = wrong[int(rng.integers(len(wrong)))]
        raw = None if method == "GET" else _bad_body(rng, kind, base)
        status, parsed, ctype = call(swarm, method, path, token=token, raw=raw)
        answers.append((method, path, status, parsed, ctype))
        sent += 1
        assert sent < 5000, "the generation did not finish"
    gen.join(120)

    wrong = [(m, p, st, body) for m, p, st, body, ct in answers
             if not (400 <= st < 500 and "json" in ct and isinstance(body, dict) and body.get("error"))]
    assert not wrong, wrong[:5]
    assert {a[2] for a in answers} >= {400, 401, 403, 404, 405, 413}
    assert result.get("tokens") == reference(prompt, 24)
    status, renewed, _ = call(swarm, "POST", f"/lease/{held['lease_id']}/renew", {}, c)
    assert status == 200 and renewed["lease_id"] == held["lease_id"]
    assert call(swarm, "POST", f"/lease/{held['lease_id']}/release", {}, c)[0] == 200
    assert _spans(swarm) == before and "fz2" not in _servers(swarm)
    h = swarm.get("/health")
    _wait_for(lambda: swarm.get("/health")["free"] == h["capacity"], 30, "every slot free again")
    print(f"fuzzer: {len(answers)} requests, statuses {sorted({a[2] for a in answers})}")
