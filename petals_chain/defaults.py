"""Named defaults shared by the layers (composition, orchestrator, servers, clients, launchers), in SI units.

Each figure used to be repeated as a literal wherever a layer needed it; a change here now
reaches the cluster files, the command lines, the orchestrator and its clients alike.
"""

from __future__ import annotations

# ---- the load a composition is sized for ----------------------------------------------------------
TARGET_LOAD = 0.7  # ρ̄: utilisation the chains are sized for (GBP-CR's stopping rule)
ARRIVAL_RATE = 0.2  # λ, requests per second, when neither a cluster file nor a flag gives one

# How the default composition estimates a candidate's JFFC mean response time where the Theorem 3.7 bounds cannot
# separate two candidates and no exact solution is at hand (analysis/estimate.py): a seeded simulation of this many
# Poisson arrivals at the design rate (the first tenth discarded as warm-up).
ESTIMATE_JOBS = 40_000
ESTIMATE_SEED = 0

# ---- orchestrator -----------------------------------------------------------------------------------
ORCHESTRATOR_PORT = 8700
LEASE_TTL_S = 60.0  # a lease not renewed for this long expires (clients renew every TTL / 3)
LEASE_WAIT_S = 600.0  # how long a lease request waits in the central queue before a 503
HEARTBEAT_TIMEOUT_S = 30.0  # a registered server silent this long is marked dead
MAX_WAITING = 100_000  # most lease requests waiting at once; more get a 503
SWEEP_INTERVAL_S = 0.5  # how often expired leases and silent servers are looked for
MAX_MEMORY_BYTES = 1e15  # a memory budget above this (1 PB) is a typo, refused by the registry and the server CLI
# Recomposition tolerance: a server's re-measured τp / τc within this relative change (τc also within the
# absolute one) keeps the composition; a larger drift recomposes.
RECOMPOSE_REL_TOL = 0.25
RECOMPOSE_ABS_TOL_S = 1e-3
# Churn (docs/orchestrator.md, "Churn"): servers that left or joined since the installed composition are repaired
# into it at once (compose/repair.py), up to this many per event, before the full recomposition; the full one runs
# in a worker process once the live servers are this many (below, it takes milliseconds: a thread is enough).
REPAIR_MAX_CHANGES = 100
# A full recomposition replaces a repaired composition only if its Theorem 3.7 lower bound on the mean response is
# this much lower (or the repaired one is unstable): every replacement may send dozens of servers loading blocks.
REPAIR_KEEP_MARGIN = 0.10
COMPOSE_PROCESS_MIN_SERVERS = 200

# ---- HTTP calls to the orchestrator ----------------------------------------------------------------
DHT_JOIN_ATTEMPTS = 4  # a client joining a busy swarm retries a DHT bootstrap that no initial peer answered
CALL_TIMEOUT_S = 30.0  # one request/reply to the orchestrator (register, heartbeat, health, release, ...)
UNREACHABLE_WAIT_S = 120.0  # a client retries an unreachable orchestrator (a restart) this long before giving up
BACKGROUND_WAIT_S = 5.0  # closing an orchestrator client waits this long for its background calls (lease releases)
RETRY_FIRST_S, RETRY_MAX_S = 0.05, 1.0  # its exponential backoff: the first pause, doubling up to this one

# ---- what a server's process needs beyond blocks + cache (measured on an H100: results/gpu/README.md) ----
CUDA_CONTEXT_BYTES = 0.7 * 2**30  # CUDA context and library handles, outside PyTorch's allocator (0.67 GiB measured)
ALLOCATOR_SLACK = 0.10  # extra share of the activation term that PyTorch's caching allocator holds back

# ---- orchestrated PETALS servers ---------------------------------------------------------------------
HEARTBEAT_PERIOD_S = 2.0  # how often a server reports that it is alive and what it serves
SETTLE_S = 2.0  # debounce: a new assignment is loaded once it has not changed for this long
DHT_UPDATE_PERIOD_S = 30.0  # how often a server re-announces its blocks in the DHT
SERVER_REQUEST_TIMEOUT_S = 180.0  # PETALS' per-request timeout on a server
MAX_LENGTH = 2048  # tokens per job (prompt + generated) a server's KV cache slots are sized for
JOB_INPUT_TOKENS = 64  # l_in of the job a server measures its τp on
JOB_OUTPUT_TOKENS = 16  # l_out of that job (and of its τc)

# ---- cross-session batching of inference steps on a server (server/batching.py, docs/batching.md) ----------------
# Most sessions whose steps run as one forward pass; 1 keeps PETALS' one-session-at-a-time pool exactly. Measured
# (results/bench/server-live-one30.txt, one 30-block SmolLM2 server): a live step of k = 16 sessions gave 5.6-8.2x
# PETALS' tokens/s inside the server against 4.3-5.4x at k = 8, and 16 sessions on a server are common (its KV room);
# a step of 16 takes about 2x one of 8, the latency a session pays for it.
MAX_BATCH_SESSIONS = 16
# How long a step waits for sessions that were in the last batches but have not sent their next step yet. Only
# those are waited for, so a lone session never waits. Measured in the same run: with 5 ms (or none) 4 and 8
# sessions settled into two half-batches (2.0 and 4.0 sessions per step) and 2.8-2.9x PETALS end to end at b = 8;
# with 20 ms 3.8-6.4 per step and 3.7-4.2x.
BATCH_WINDOW_S = 0.020
# Most tokens (hypotheses x new tokens, summed over sessions) in one batched step: bounds its working memory
# (about 32 KiB per token for SmolLM2 in float32) and how long a decode waits behind a prefill sharing its step.
MAX_BATCH_TOKENS = 256
# Most tokens a long step (a prompt, a failover replay) advances per batched step: it runs in chunks of this many
# beside the other sessions' steps (chunked prefill), so a decode waits for at most one chunk. Measured on this
# machine's CPU (bench server-prefill, results/bench/server-prefill.txt: 4-8 sessions decoding, 15 blocks, beside a
# 512-1024-token prompt; one run per cell): chunks of 32 stall decodes 0.23-0.59 as long as PETALS' pool does and
# finish the prompt in 0.38-0.66 of its time (PETALS' block-by-block path on our pool: 0.40-1.23 and 0.46-0.84);
# chunks of 16 stall decodes least (0.25-0.32) but the prompt takes 0.54-0.95; chunks of 256 finish it soonest
# (0.19-0.47) but stall decodes 2.2-3.8x as long as PETALS. On a GPU a chunk of 256 tokens over a span costs about
# a decode step's weight traffic (not measured here), so CUDA servers take 256.
PREFILL_CHUNK_TOKENS_CPU = 32
PREFILL_CHUNK_TOKENS_CUDA = 256
# How a batched decode step attends (server/batched_step.py): "per_session" runs each session's attention in place
# over its own cache; "gathered" copies the sessions' caches into one padded batch and attends once; "auto" picks
# gathered on a CUDA device and per session elsewhere. Measured: on an H200 (results/gpu-batched/, LLaMA-2-7B
# shapes, bf16) gathered gave 1.1-3.6x per session's tokens/s at b = 2...64; on this machine's CPU per session
# was faster at long and mixed contexts (bench server-step's attention alternatives).
BATCH_ATTENTION_MECHANISMS = ("per_session", "gathered", "auto")
BATCH_ATTENTION = "auto"
# Whether a batching server keeps its sessions' KV caches as rows of one tensor per block (server/kv_arena.py), so
# the gathered attention reads them in place instead of copying: "on", "off", or "auto" (on for caches on CUDA
# devices, where the gathered attention runs; measured on an H200 with the arena layout: 0.48-0.77 of the bare
# forward at 64 sessions against 0.1-0.2 with a copy, results/gpu-batched/). Each session is charged a full slot.
KV_ARENA_MODES = ("auto", "on", "off")
KV_ARENA = "auto"
