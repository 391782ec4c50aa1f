"""Cross-session batching in the live server: a task pool that hands the runtime several sessions' steps at once.

PETALS' merged inference pool (``PrioritizedTaskPool``) gives hivemind's runtime one task, one session's step, at
a time. :class:`BatchingInferencePool` subclasses it: ``load_batch_to_runtime`` takes the head task and every
other queued task that can share its forward pass (same blocks, no deep prompts, no active adapter, no beam
reordering, within ``max_sessions`` and ``max_tokens``), waiting at most ``window_s`` for sessions that were in
the last batches and have not sent their next step yet. :class:`BatchingRuntime` (PETALS' runtime with one more
case) runs such a batch through :class:`~petals_chain.server.batched_step.BatchedMergedInferenceStep` and the
pool returns each session's outputs, or its own exception, to that session's future. If a batched step fails,
its sessions are run again one at a time through PETALS' own step, so one bad session cannot fail the others
(the batched step only writes a session's cache at the positions its step owns, which the retry overwrites).
A step longer than ``prefill_chunk_tokens`` (a prompt, a failover replay) runs in chunks that share batches with
other sessions' steps (chunked prefill, :meth:`BatchingInferencePool._gather`); for that, every step is sent to the
merged pool (:func:`route_long_steps_to_merged_pool`) instead of PETALS' block-by-block path for long ones.

Everything else stays PETALS': the handler still submits one task per session step, cache reads and writes of
the KV transfer (``kv_handler.KvCacheOp``) and anything not batchable run alone through the pool's
``process_func``, and hivemind's runtime still picks the pool whose head task has the lowest (priority, time),
so inference goes before forward/backward. :func:`install_batching` makes petals' ``ModuleContainer`` build
this pool and runtime (module attributes of ``petals.server.server``, as ``install_kv_transfer`` swaps the
handler class); ``max_sessions = 1`` restores PETALS' own, so every earlier result stays reproducible.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
from pydantic import Field, StrictFloat, StrictInt, field_validator
from petals.data_structures import InferenceMetadata
from petals.server.backend import _MergedInferenceStep
from petals.server.server import RuntimeWithDeduplicatedPools
from petals.server.task_pool import PrioritizedTaskPool, Task, _move_to_device_if_tensor

from petals_chain import defaults
from petals_chain.declared import Declared, one_of
from petals_chain.server.bare_probe import BareProbe
from petals_chain.server.batched_step import BatchedMergedInferenceStep, BatchedSpanStep

log = logging.getLogger(__name__)

BATCH_LOG_PREFIX = "batched inference step of"  # the log line of each new largest batch (live tests read it)
STATS_PERIOD_S = 30.0  # how often the pool logs its histogram of sessions per step (when it changed)
RECENT_BATCHES = 2  # a session seen in this many last batches is expected back (the window waits for it)
PERIOD_SMOOTHING = 0.5  # weight of the newest gap between a session's steps in its estimated period
STEP_LOG_ENV = "PETALS_CHAIN_STEP_LOG"  # a CSV path: every runtime batch appends "sessions,tokens,seconds,bare_seconds"


class StepLog:
    """Appends one CSV row per inference batch the runtime ran: sessions, tokens and the seconds of the step itself
    (no queueing, no RPC). How the profiler measures τp(b) inside the server (launch/profile_live.py); a file, not
    a buffer, so the server's memory does not grow with its uptime."""

    HEADER = "sessions,tokens,seconds,bare_seconds\n"

    def __init__(self, path: str) -> None:
        self.path = path
        fresh = not os.path.exists(path) or os.path.getsize(path) == 0
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the server's lifetime, line-buffered
        if fresh:
            self._file.write(self.HEADER)

    def write(self, sessions: int, tokens: int, seconds: float, bare_seconds: float | None = None) -> None:
        """One batch's row; ``bare_seconds``: the bare forward that mirrored it (server/bare_probe.py), if probed."""
        bare = "" if bare_seconds is None else f"{bare_seconds:.6f}"
        self._file.write(f"{sessions},{tokens},{seconds:.6f},{bare}\n")

    @classmethod
    def from_env(cls) -> StepLog | None:
        """The log named by ``PETALS_CHAIN_STEP_LOG``, or None when unset."""
        path = os.environ.get(STEP_LOG_ENV, "")
        return cls(path) if path else None


class BatchingConfig(Declared):
    """The batching options of a server (``--max-batch-sessions``, ``--batch-window-ms``, ``--max-batch-tokens``,
    ``--batch-attention``, ``--runtime-cpus``, ``--kv-arena``, ``--step-log``, ``--bare-probe-every``)."""

    OWNER: ClassVar[str] = "batching"

    max_sessions: Annotated[StrictInt, Field(ge=1)] = defaults.MAX_BATCH_SESSIONS
    """The most sessions one step batches (1: PETALS' pool, one at a time)."""
    window_s: Annotated[StrictFloat, Field(ge=0.0)] = defaults.BATCH_WINDOW_S
    """How long a step waits for sessions of the last batches that have not sent theirs yet."""
    max_tokens: Annotated[StrictInt, Field(ge=1)] = defaults.MAX_BATCH_TOKENS
    """Most tokens (hypotheses x new tokens over all sessions) in one batched step."""
    prefill_chunk_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    """Most tokens a long step advances per batched step; None: by device (defaults.PREFILL_CHUNK_TOKENS_CPU/_CUDA)."""
    step_log: str = ""
    """CSV of every batch's sessions, tokens and seconds ("": PETALS_CHAIN_STEP_LOG, if set)."""
    attention: str = defaults.BATCH_ATTENTION
    """How a batched decode step attends (defaults.BATCH_ATTENTION_MECHANISMS)."""
    runtime_cpus: tuple[StrictInt, ...] = ()
    """The runtime thread's CPUs; the server's other threads get the rest."""
    kv_arena: str = defaults.KV_ARENA
    """Sessions' caches as rows of one tensor per block (server/kv_arena.py; defaults.KV_ARENA_MODES)."""
    bare_probe_every: Annotated[StrictInt, Field(ge=0)] = 0
    """Time the bare forward after every N-th decode batch (server/bare_probe.py); 0: off."""

    @field_validator("attention")
    @classmethod
    def _attention(cls, value: str) -> str:
        return one_of(value, defaults.BATCH_ATTENTION_MECHANISMS)

    @field_validator("kv_arena")
    @classmethod
    def _kv_arena(cls, value: str) -> str:
        return one_of(value, defaults.KV_ARENA_MODES)

    def for_device(self, device: torch.device | str | None) -> BatchingConfig:
        """This config with the prefill chunk resolved for a server on ``device`` (None: CPU)."""
        if self.prefill_chunk_tokens is not None:
            return self
        cuda = device is not None and torch.device(device).type == "cuda"
        return self.replace(prefill_chunk_tokens=defaults.PREFILL_CHUNK_TOKENS_CUDA if cuda else
                            defaults.PREFILL_CHUNK_TOKENS_CPU)

    @property
    def enabled(self) -> bool:
        """Whether the server batches at all (``max_sessions`` 1 is PETALS' pool, unchanged)."""
        return self.max_sessions > 1


def _batchable_key(args: Sequence[Any]) -> tuple[tuple[str, ...], int] | None:
    """(block uids, the session's first cache handle) of a task that may share a batched step, else None.

    A task joins a batch only if it is a plain merged-pool step: hidden states ``[batch, n, hidden]``, hypo ids that
    do not reorder (dummy or ``0..batch-1``), one ``InferenceMetadata`` per block, no deep prompt, no adapter. The
    handle identifies the session (each allocation has its own handles).
    """
    if len(args) < 3 or not isinstance(args[0], torch.Tensor) or args[0].ndim != 3 or args[0].numel() == 0:
        return None
    infos = args[2]
    if not isinstance(infos, tuple) or not infos or not all(isinstance(i, InferenceMetadata) for i in infos):
        return None
    if any(i.active_adapter for i in infos) or any(p is not None for p in args[3:]):
        return None
    hypo_ids = args[1]
    if isinstance(hypo_ids, torch.Tensor) and hypo_ids.numel() > 0:
        if hypo_ids.numel() != args[0].shape[0] or not torch.equal(hypo_ids.cpu(),
                                                                    torch.arange(hypo_ids.numel())):
            return None
    if not infos[0].cache_handles:
        return None
    return tuple(i.uid for i in infos), int(infos[0].cache_handles[0])


@dataclass(frozen=True)
class _Part:
    """What one batch runs of a task: new-token positions ``start ... start + length − 1`` of ``total`` (the whole
    step when ``start`` is 0 and ``length`` is ``total``; a chunk of a long step otherwise)."""

    task: Task
    start: int
    length: int
    total: int

    @property
    def whole(self) -> bool:
        """The task's step in one piece."""
        return self.start == 0 and self.length == self.total

    @property
    def last(self) -> bool:
        """This part ends the task's step (its future is answered after it)."""
        return self.start + self.length >= self.total

    def args(self) -> tuple[Any, ...]:
        """The task's arguments for this part: its hidden states' positions and prefix lengths moved by ``start``."""
        if self.whole:
            return tuple(self.task.args)
        hidden, hypo_ids, infos, *rest = self.task.args
        moved = tuple(InferenceMetadata(i.uid, i.prefix_length + self.start, i.cache_handles, i.active_adapter)
                      for i in infos)
        return (hidden[:, self.start:self.start + self.length], hypo_ids, moved, *rest)


_NOT_YET = object()  # run_batch's result for a chunk that does not end its task's step (no answer is sent)


class BatchingInferencePool(PrioritizedTaskPool):
    """PETALS' merged inference pool, loading every compatible ready session's step into one runtime batch.

    ``process_func`` stays PETALS' one-task step (``_MergedInferenceStep``, or the KV handler's wrapper of it) and
    runs whatever goes alone; ``batched_step`` runs two or more sessions' steps in one pass. The pool's counting
    pipe gets one ``recv`` per task taken and its ``priority`` is the remaining head task's, exactly as PETALS
    keeps them, so hivemind's runtime chooses between pools as before.
    """

    def __init__(self, process_func: Any, batched_step: BatchedMergedInferenceStep, *, config: BatchingConfig,
                 max_batch_size: int, name: str, device: torch.device | None = None, **kwargs: Any) -> None:
        super().__init__(process_func, max_batch_size=max_batch_size, name=name, device=device, **kwargs)
        self.batched_step = batched_step
        self.config = config.for_device(device)  # the prefill chunk resolved for this pool's device
        self._recent: deque[frozenset[int]] = deque(maxlen=RECENT_BATCHES)
        self._arrivals: dict[int, tuple[float, float]] = {}  # session → (its last step's submission, period or nan)
        self.sessions_per_step: Counter[int] = Counter()  # how many runtime batches had k sessions
        self.retried_batches = 0
        self._largest = 1
        self._stats_lock = threading.Lock()
        self._last_stats = (time.monotonic(), Counter())
        self.step_log = StepLog(config.step_log) if config.step_log else StepLog.from_env()
        self._partial: dict[int, list[torch.Tensor]] = {}  # task uid → outputs of its chunks run so far
        self._batch_ids = itertools.count()  # a batch's uid (a chunked task heads several batches: not its uid)
        self.chunks_run = 0  # chunks of long steps that ran (each in a batch of its own or beside other steps)
        # the probe's only output is the step log's bare column: without a log it would run forwards for nothing
        self.bare_probe = BareProbe(batched_step, config.bare_probe_every) \
            if config.bare_probe_every and self.step_log is not None else None
        if config.bare_probe_every and self.step_log is None:
            log.warning("--bare-probe-every %d has no step log to write to (--step-log): the probe stays off",
                        config.bare_probe_every)

    # ---- loading a batch (runtime thread) -----------------------------------------------------------------------

    def load_batch_to_runtime(self, timeout: float | None = None,
                              device: torch.device | None = None) -> tuple[int, list[Any]]:
        """The head task plus every queued task that can join it; returns (batch uid, [list of task args])."""
        device = device if device is not None else self.device
        head: Task = self._ordered_tasks.get(block=True, timeout=timeout)
        key = _batchable_key(head.args)
        if key is not None and self.config.enabled:
            parts = self._gather(head, key)
        else:  # a KV transfer, deep prompts, an adapter, beams: PETALS' step, whole
            parts = [_Part(head, 0, 1, 1)]
        for _ in parts:
            self.batch_receiver.recv()  # one count per task taken, as PETALS' pool does for its one task
        q = self._ordered_tasks
        with q.mutex:
            if q.queue:
                first: Task = q.queue[0]
                self.priority = (first.priority, first.time_submitted)
        self._recent.append(frozenset(k[1] for p in parts if (k := _batchable_key(p.task.args)) is not None))
        self._note_arrivals(parts)
        batch = [[_move_to_device_if_tensor(arg, device, share_memory=False) for arg in p.args()] for p in parts]
        uid = next(self._batch_ids)
        self._dispatched_tasks[uid] = parts
        return uid, [batch]

    def _note_arrivals(self, parts: Sequence[_Part]) -> None:
        """Record when each session's new step was submitted and smooth its period (the gap between its steps);
        forget sessions that left the recent batches (the record stays as small as the batches)."""
        for part in parts:
            k = _batchable_key(part.task.args)
            if k is None or part.start:  # a step's later chunks are not new arrivals
                continue
            t = part.task.time_submitted
            last, period = self._arrivals.get(k[1], (math.nan, math.nan))
            gap = t - last
            period = gap if math.isnan(period) else PERIOD_SMOOTHING * gap + (1 - PERIOD_SMOOTHING) * period
            self._arrivals[k[1]] = (t, period)
        recent = set().union(*self._recent)
        for session in [s for s in self._arrivals if s not in recent]:
            del self._arrivals[session]

    def _due(self, session: int, by: float) -> bool:
        """Whether ``session``'s next step is expected by ``by`` (its last submission plus its period; late ones
        too), or its period is not known yet."""
        last, period = self._arrivals.get(session, (math.nan, math.nan))
        return math.isnan(period) or last + period <= by

    def _left(self, task: Task) -> tuple[int, int]:
        """(new-token positions of the task's step not run yet, hypotheses) of a batchable task."""
        h = task.args[0]
        done = sum(int(o.shape[1]) for o in self._partial.get(task.uid, ()))
        return int(h.shape[1]) - done, int(h.shape[0])

    def _gather(self, head: Task, key: tuple[tuple[str, ...], int]) -> list[_Part]:
        """The parts of ``head`` and of the queued tasks that can join it (priority order), waiting up to the window
        for sessions of the recent batches that are not here yet.

        Chunked prefill: a step with more tokens left than ``prefill_chunk_tokens`` (C) is *long*. At most one long
        step joins a batch, and only while min(C, half the budget) is free; it then runs as many of its next
        positions as C and the budget leave after the other steps, and goes back to the queue with its place (its
        priority and submission time) until its last chunk has run. So a long prompt shares its steps with the
        decodes of other sessions instead of holding the runtime for its whole prefill, a decode waits at most one
        chunk, and no step exceeds the budget. Short steps run whole."""
        uids, _ = key
        budget = self.config.max_tokens
        chunk = min(budget, self.config.prefill_chunk_tokens)
        reserve = max(1, min(chunk, budget // 2))
        sessions = {key[1]}
        deadline = time.monotonic() + self.config.window_s
        # the window waits for the sessions of the recent batches whose next step is due within a window after it
        # ends (late ones included; the margin keeps sessions in lockstep despite jitter): sessions that run a step
        # apart, as on a chain behind round trips, are not waited for
        due = {s for s in set().union(*self._recent) - sessions if self._due(s, deadline + self.config.window_s)}
        whole: list[Task] = []
        long: Task | None = None
        fixed = 0  # tokens of the steps that run whole

        def join(task: Task) -> bool:
            nonlocal long, fixed
            left, hyp = self._left(task)
            if hyp * left > chunk:
                if long is not None or fixed > budget - reserve:
                    return False
                long = task
                return True
            if fixed + hyp * left > budget - (reserve if long is not None else 0):
                return False
            whole.append(task)
            fixed += hyp * left
            return True

        join(head)
        q = self._ordered_tasks
        with q.not_empty:  # the queue's own lock: the prioritizer thread's put() waits while we scan
            while True:
                keep: list[Task] = []
                for task in sorted(q.queue):
                    k = _batchable_key(task.args)
                    if (len(whole) + (long is not None) < self.config.max_sessions and k is not None and k[0] == uids
                            and k[1] not in sessions and join(task)):
                        sessions.add(k[1])
                    else:
                        keep.append(task)
                if len(keep) != len(q.queue):
                    q.queue[:] = keep
                    heapq.heapify(q.queue)
                remaining = deadline - time.monotonic()
                full = fixed >= budget or (long is not None and fixed + min(chunk, budget - fixed) >= budget) \
                    or len(whole) + (long is not None) >= self.config.max_sessions
                if due <= sessions or remaining <= 0 or full:
                    break
                q.not_empty.wait(remaining)  # released while waiting; a put() wakes us to scan again
        parts = []
        for task in whole:
            left, _ = self._left(task)
            total = int(task.args[0].shape[1])
            parts.append(_Part(task, total - left, left, total))
        if long is not None:
            left, hyp = self._left(long)
            total = int(long.args[0].shape[1])
            length = min(left, max(1, min(chunk, budget - fixed) // hyp))
            parts.append(_Part(long, total - left, length, total))
        return parts

    # ---- running it (runtime thread, called by BatchingRuntime) ---------------------------------------------------

    def run_batch(self, batch: Sequence[Sequence[Any]], uid: int) -> tuple[list[Any], int]:
        """Run batch ``uid``'s steps; returns (per task its outputs tuple, its exception, or a marker for a chunk that
        does not end its step, total tokens). A chunked step's task goes back to the queue here, in the runtime
        thread, before the next batch is loaded."""
        tokens = sum(int(a[0].shape[0] * a[0].shape[1]) if isinstance(a[0], torch.Tensor) and a[0].ndim == 3 else 1
                     for a in batch)
        started = time.perf_counter()
        if len(batch) == 1 and _batchable_key(batch[0]) is None:  # a KV transfer, deep prompts, an adapter, beams
            results = [self._run_alone(batch[0])]
        else:  # a lone batchable session too: the same arithmetic whether or not others share its step
            try:
                outputs = self.batched_step([(a[0], a[1], a[2]) for a in batch])
                results = [(out.clone(),) for out in outputs]
            except Exception as exc:  # retried one session at a time: a bad session fails only itself
                log.warning("batched step of %d sessions failed (%s: %s); running them one at a time",
                            len(batch), type(exc).__name__, exc)
                self.retried_batches += 1
                results = [self._run_alone(args) for args in batch]
        results = self._join_chunks(self._dispatched_tasks.get(uid, ()), results)
        seconds = time.perf_counter() - started
        bare = self.bare_probe.after(batch) if self.bare_probe is not None else None
        if self.step_log is not None:
            self.step_log.write(len(batch), tokens, seconds, bare)
        self._count(len(batch))
        return results, tokens

    def _join_chunks(self, parts: Sequence[_Part], results: list[Any]) -> list[Any]:
        """Keep the outputs of chunks that do not end their step and requeue their tasks; a step's last chunk gets
        every chunk's outputs joined; a failed chunk fails its step (what it had run is dropped)."""
        for i, (part, result) in enumerate(zip(parts, results)):
            if part.whole:
                continue
            self.chunks_run += 1
            done = self._partial.pop(part.task.uid, [])
            if isinstance(result, BaseException):
                continue
            done.append(result[0])
            if part.last:
                results[i] = (torch.cat(done, dim=1),)
                continue
            self._partial[part.task.uid] = done
            results[i] = _NOT_YET
            task = part.task
            self._ordered_tasks.put(task)
            self.batch_sender.send(None)  # the task counts as queued again until its last chunk is taken
            if (task.priority, task.time_submitted) < self.priority:
                self.priority = (task.priority, task.time_submitted)
        return results

    def _run_alone(self, args: Sequence[Any]) -> Any:
        """PETALS' one-task step (``process_func``): its outputs, or the exception it raised."""
        try:
            return tuple(self.process_func(*args))
        except Exception as exc:  # handed to this task's future only
            return exc

    def _count(self, sessions: int) -> None:
        """Count a step of ``sessions`` sessions; log each new largest batch and, periodically, the histogram."""
        with self._stats_lock:
            self.sessions_per_step[sessions] += 1
            if sessions > self._largest:
                self._largest = sessions
                log.info("%s %d sessions (the largest so far)", BATCH_LOG_PREFIX, sessions)
            since, before = self._last_stats
            now = time.monotonic()
            if now - since >= STATS_PERIOD_S:
                delta = self.sessions_per_step - before
                if delta:
                    steps = sum(delta.values())
                    mean = sum(k * v for k, v in delta.items()) / steps
                    log.info("inference steps in the last %.0f s: %d, %.2f sessions per step on average, "
                             "sessions per step %s", now - since, steps, mean, dict(sorted(delta.items())))
                self._last_stats = (now, Counter(self.sessions_per_step))

    # ---- answering each task ------------------------------------------------------------------------------------

    def send_outputs_from_runtime(self, uid: int, batch_outputs: list[Any]) -> None:
        """Give each task of batch ``uid`` its own outputs (in shared memory, as PETALS does) or its exception."""
        parts = self._dispatched_tasks.pop(uid, None)
        if parts is None:
            log.error("internal error: batch %s is missing from the dispatched tasks; no result set", uid)
            return
        for part, result in zip(parts, batch_outputs):
            task = part.task
            if result is _NOT_YET:
                continue
            if isinstance(result, BaseException):
                task.future.set_exception(result)
            else:
                task.future.set_result([_move_to_device_if_tensor(out, device="cpu", share_memory=True)
                                        for out in result])

    def send_exception_from_runtime(self, uid: int, exception: BaseException) -> None:
        """The runtime failed outside the step itself: every task of batch ``uid`` gets the exception."""
        parts = self._dispatched_tasks.pop(uid, None)
        if parts is None:
            log.error("internal error: batch %s is missing from the dispatched tasks; exception %s lost", uid,
                      exception)
            return
        for part in parts:
            self._partial.pop(part.task.uid, None)
            if not part.task.future.done():
                part.task.future.set_exception(exception)


class PinnedRuntime(RuntimeWithDeduplicatedPools):
    """PETALS' runtime whose thread, the one that computes every step, runs on its own CPUs (``--runtime-cpus``).

    The thread pins itself on its first batch, after it has started the pools' and the output senders' threads, so
    those keep the process's CPUs (the others, :func:`pin_server_process`). Without CPUs it is PETALS' runtime.
    """

    runtime_cpus: tuple[int, ...] = ()
    _pinned = False

    def _pin_once(self) -> None:
        """Pin the calling thread (the runtime's) to ``runtime_cpus``, the first time only."""
        if self.runtime_cpus and not self._pinned:
            os.sched_setaffinity(0, self.runtime_cpus)  # 0: the calling thread (Linux)
            self._pinned = True
            log.info("the runtime thread runs on CPUs %s", ",".join(map(str, self.runtime_cpus)))

    def process_batch(self, pool: Any, batch_index: int, *batch: Any) -> tuple[Any, int]:
        """Pin this thread once, then PETALS' ``process_batch``."""
        self._pin_once()
        return super().process_batch(pool, batch_index, *batch)


def pin_server_process(runtime_cpus: Sequence[int]) -> tuple[int, ...]:
    """Move this process (and every thread and process it starts from now on) off ``runtime_cpus``; returns the
    CPUs left to it. ValueError naming the CPUs when they are not this process's or leave it none."""
    available = set(os.sched_getaffinity(0))
    wanted = set(runtime_cpus)
    if not wanted <= available:
        raise ValueError(f"--runtime-cpus {','.join(map(str, sorted(wanted)))}: this process may only use CPUs"
                         f" {','.join(map(str, sorted(available)))}")
    rest = available - wanted
    if not rest:
        raise ValueError(f"--runtime-cpus {','.join(map(str, sorted(wanted)))} leaves no CPU for the server's other"
                         " threads and processes")
    os.sched_setaffinity(0, rest)
    return tuple(sorted(rest))


class BatchingRuntime(PinnedRuntime):
    """PETALS' runtime that runs a :class:`BatchingInferencePool`'s batches through the pool's ``run_batch``.

    Batches are loaded just before they run (no prefetching thread): a prefetching loader would pop each step
    the moment it arrived, one by one, while the previous batch was still computing, and nothing would batch.
    On CPU the prefetch saved nothing anyway (it overlaps host-to-device copies).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if any(isinstance(pool, BatchingInferencePool) for pool in self.pools):
            self.prefetch_batches = 0

    def process_batch(self, pool: Any, batch_index: int, *batch: Any) -> tuple[Any, int]:
        """A batching pool's batch: per task outputs (or exceptions) and the tokens; any other pool: PETALS'."""
        if isinstance(pool, BatchingInferencePool):
            self._pin_once()
            return pool.run_batch(batch[0], batch_index)
        return super().process_batch(pool, batch_index, *batch)


_PETALS_SHORT_STEP = {}  # PETALS' own limits on the tokens of a step that goes to the merged pool, saved once


def route_long_steps_to_merged_pool(merged: bool) -> None:
    """PETALS sends a step of more than 128 tokens (``MAX_SHORT_INFERENCE_TOKENS``; 1 for NF4) block by block
    through each backend's pool; ``merged`` sends every step to the merged pool instead, where the batching pool
    cuts long ones into chunks (chunked prefill); False restores PETALS' limits. Module attributes of
    ``petals.server.block_functions``, read at each step; set before the server forks its handlers."""
    import petals.server.block_functions as block_functions

    names = ("MAX_SHORT_INFERENCE_TOKENS", "MAX_NF4_SHORT_INFERENCE_TOKENS")
    if not _PETALS_SHORT_STEP:
        _PETALS_SHORT_STEP.update({n: getattr(block_functions, n) for n in names})
    for name in names:
        setattr(block_functions, name, sys.maxsize if merged else _PETALS_SHORT_STEP[name])


def batchable_span(backends: dict[str, Any]) -> str | None:
    """None if the batched step can serve these blocks, else why not (tensor parallelism, not LLaMA, ...)."""
    try:
        BatchedSpanStep([b.module for b in backends.values()])
    except (TypeError, ValueError, AttributeError) as exc:
        return str(exc)
    return None


def merge_batching_pools_inplace(backends: dict[str, Any], config: BatchingConfig) -> None:
    """PETALS' ``merge_inference_pools_inplace`` with a :class:`BatchingInferencePool` as the merged pool (or
    PETALS' own pool when batching is off or the blocks cannot be batched)."""
    from petals.server.backend import merge_inference_pools_inplace

    why = batchable_span(backends) if config.enabled else "--max-batch-sessions 1"
    if why is not None:
        log.info("inference steps run one session at a time (PETALS' pool): %s", why)
        route_long_steps_to_merged_pool(False)
        merge_inference_pools_inplace(backends)
        return
    route_long_steps_to_merged_pool(True)
    first_pool = next(iter(backends.values())).inference_pool
    batched = BatchedMergedInferenceStep(backends, attention=config.attention)
    pool = BatchingInferencePool(_MergedInferenceStep(backends), batched, config=config,
                                 max_batch_size=first_pool.max_batch_size, device=first_pool.device,
                                 name="merged_inference")
    for backend in backends.values():
        assert not backend.inference_pool.is_alive()
        backend.inference_pool = pool
    log.info("inference steps of up to %d sessions run together (window %.1f ms, at most %d tokens per step, longer"
             " steps in chunks of %d; attention %s)", config.max_sessions, config.window_s * 1e3, config.max_tokens,
             pool.config.prefill_chunk_tokens, config.attention)


def install_batching(config: BatchingConfig) -> None:
    """Make petals' server (in this process) build the batching pool and runtime; PETALS' own when disabled."""
    import petals.server.backend as petals_backend
    import petals.server.server as petals_server

    PinnedRuntime.runtime_cpus = tuple(config.runtime_cpus)
    if config.runtime_cpus:
        rest = pin_server_process(config.runtime_cpus)
        log.info("the runtime thread will run on CPUs %s, the rest of the server on %s",
                 ",".join(map(str, config.runtime_cpus)), ",".join(map(str, rest)))
    if config.enabled:
        petals_server.merge_inference_pools_inplace = lambda backends: merge_batching_pools_inplace(backends, config)
        petals_server.RuntimeWithDeduplicatedPools = BatchingRuntime
    else:
        petals_server.merge_inference_pools_inplace = petals_backend.merge_inference_pools_inplace
        route_long_steps_to_merged_pool(False)
        petals_server.RuntimeWithDeduplicatedPools = PinnedRuntime if config.runtime_cpus else \
            RuntimeWithDeduplicatedPools
