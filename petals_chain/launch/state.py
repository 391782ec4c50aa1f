"""What a launch created (namespaces, links, process groups, MIG instances), on disk, so teardown always finds it.

Every launch gets a tag (its PID in base 36) and names everything after it: namespaces
``pcl-<tag>-<j>``, veth ends ``pcl-<tag>-r<j>`` (root side) / ``pcl-<tag>-n<j>`` (namespace
side). Before creating anything it writes a record to ``$PETALS_CHAIN_LAUNCH_STATE``
(default ``/run/petals_chain_launch``), and every process it starts carries
``PETALS_CHAIN_LAUNCH_TAG=<tag>`` in its environment. Teardown (the launcher's atexit/signal
handlers, or ``python -m petals_chain.launch --teardown`` after a crash) removes what the record
lists, any process carrying the tag, any process left inside the namespaces, and any
namespace or link with the prefix whose tag has no live owner. Each step is idempotent.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from petals_chain.launch.commands import run

PREFIX = "pcl"
TAG_ENV = "PETALS_CHAIN_LAUNCH_TAG"
STATE_ENV = "PETALS_CHAIN_LAUNCH_STATE"
DEFAULT_STATE_DIR = "/run/petals_chain_launch"
_NS_RE = re.compile(rf"^{PREFIX}-([0-9a-z]+)-[0-9a-z]+$")
_LINK_RE = re.compile(rf"^{PREFIX}-([0-9a-z]+)-[rn][0-9]+$")
MigTeardown = Callable[[list[dict]], list[str]]  # undoes the "mig" entries of a record, returns problems


def state_dir() -> Path:
    """Where launch records live (created on demand)."""
    return Path(os.environ.get(STATE_ENV, DEFAULT_STATE_DIR))


def _base36(n: int) -> str:
    """``n`` in base 36 (short tags keep interface names under Linux's 15 characters)."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def ns_name(tag: str, j: int | str) -> str:
    """The network namespace of server ``j`` (or a helper name such as 'probe')."""
    return f"{PREFIX}-{tag}-{j}"


def root_link(tag: str, j: int) -> str:
    """The root-namespace end of server ``j``'s veth pair (at most 15 characters)."""
    return f"{PREFIX}-{tag}-r{j}"


def ns_link(tag: str, j: int) -> str:
    """The namespace end of server ``j``'s veth pair."""
    return f"{PREFIX}-{tag}-n{j}"


def process_start_ticks(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, /proc/PID/stat field 22): tells a PID from its reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass
class Record:
    """One launch's resources; saved atomically on every change."""

    tag: str
    owner_pid: int
    owner_start: int | None
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    pgids: list[int] = field(default_factory=list)
    mig: list[dict] = field(default_factory=list)  # {"gpu": i, "gis": [ids], "enabled_mig": bool}

    @property
    def path(self) -> Path:
        """The record's file."""
        return state_dir() / f"{self.tag}.json"

    def save(self) -> None:
        """Write the record (temp file + rename, so a crash never leaves half a file)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.path)

    def add(self, kind: str, value: object) -> None:
        """Register a resource *before* creating it (netns, links, pgids or mig) and save."""
        items = getattr(self, kind)
        if value not in items:
            items.append(value)
        self.save()

    def owner_alive(self) -> bool:
        """Whether the launch that wrote this record is still running (same PID and same start time)."""
        return self.owner_start is not None and process_start_ticks(self.owner_pid) == self.owner_start


def new_record(pid: int | None = None) -> Record:
    """A fresh record for this process; the tag is the PID in base 36 (+ a letter if a stale one is in the way)."""
    pid = os.getpid() if pid is None else pid
    base = _base36(pid)
    taken = {r.tag for r in list_records()} | set(leftover_tags())
    tag = base
    for suffix in "abcdefghijklmnopqrstuvwxyz":
        if tag not in taken:
            break
        tag = base + suffix
    rec = Record(tag, pid, process_start_ticks(pid))
    rec.save()
    return rec


def load_record(path: Path) -> Record | None:
    """Read a record file; None if it is unreadable (a torn write cannot happen, but a hand edit can)."""
    try:
        data = json.loads(path.read_text())
        return Record(**data)
    except (OSError, ValueError, TypeError):
        return None


def list_records() -> list[Record]:
    """All launch records on this machine."""
    d = state_dir()
    if not d.is_dir():
        return []
    return [r for p in sorted(d.glob("*.json")) if (r := load_record(p)) is not None]


def list_netns() -> list[str]:
    """Names of all network namespaces (``ip netns list``)."""
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_links() -> list[str]:
    """Names of all links in the root namespace."""
    out = run(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def leftover_tags() -> set[str]:
    """Tags of namespaces and links with our prefix that exist right now."""
    tags = {m.group(1) for n in list_netns() if (m := _NS_RE.match(n))}
    return tags | {m.group(1) for n in list_links() if (m := _LINK_RE.match(n))}


def _environ_tag(pid: int) -> str | None:
    """The launch tag in a process's environment, if any."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in env.split(b"\0"):
        if item.startswith(TAG_ENV.encode() + b"="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return None


def tagged_pgids(tag: str) -> set[int]:
    """Process groups that hold a process carrying ``tag`` in its environment (never our own group)."""
    own = os.getpgrp()
    groups = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _environ_tag(int(entry.name)) == tag:
            try:
                pgid = os.getpgid(int(entry.name))
            except OSError:
                continue
            if pgid != own:
                groups.add(pgid)
    return groups


def kill_groups(pgids: set[int], grace_s: float = 3.0) -> None:
    """SIGTERM each process group, wait up to ``grace_s`` for it to empty, then SIGKILL what is left."""
    live = set()
    for g in pgids:
        try:
            os.killpg(g, signal.SIGTERM)
            live.add(g)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        for g in list(live):
            try:
                os.killpg(g, 0)
            except ProcessLookupError:
                live.discard(g)
        time.sleep(0.05)
    for g in live:
        try:
            os.killpg(g, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _ns_pids(ns: str) -> set[int]:
    """PIDs of the processes inside namespace ``ns``."""
    out = run(["ip", "netns", "pids", ns], check=False).stdout
    return {int(x) for x in out.split() if x.isdigit()}


def _kill_pids(pids: set[int], grace_s: float = 2.0) -> None:
    """SIGTERM the processes, then SIGKILL whichever is still there after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 0.0)
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.05)


def teardown_network(tag: str, netns: list[str], links: list[str]) -> list[str]:
    """Kill tagged process groups and anything inside the namespaces, delete links and namespaces; problems left."""
    kill_groups(tagged_pgids(tag))
    existing = set(list_netns())
    for ns in netns:
        if ns in existing:
            _kill_pids(_ns_pids(ns) - {os.getpid()})
    for link in links:
        run(["ip", "link", "del", link], check=False)
    for ns in netns:
        run(["ip", "netns", "del", ns], check=False)
    # Namespace destruction is asynchronous in the kernel: wait until the veth ends are really gone.
    deadline = time.monotonic() + 5.0
    while True:
        left = [x for x in list_links() if x in links] + [x for x in list_netns() if x in netns]
        if not left:
            return []
        if time.monotonic() > deadline:
            return [f"still present after teardown: {', '.join(left)}"]
        time.sleep(0.05)


def _own(tag: str) -> tuple[list[str], list[str]]:
    """Namespaces and links that exist now and carry ``tag``."""
    ns = [n for n in list_netns() if (m := _NS_RE.match(n)) and m.group(1) == tag]
    return ns, [n for n in list_links() if (m := _LINK_RE.match(n)) and m.group(1) == tag]


def teardown_record(rec: Record, mig_teardown: MigTeardown | None = None) -> list[str]:
    """Undo everything a record lists (processes, MIG instances, links, namespaces); delete the record if clean."""
    problems = []
    # Servers first (a MIG instance in use cannot be destroyed). Only groups that still hold a process carrying
    # our tag: a recorded PGID whose processes are gone may have been reused by someone else's.
    kill_groups(tagged_pgids(rec.tag))
    if rec.mig and mig_teardown is not None:
        problems += mig_teardown(rec.mig)
    ns, links = _own(rec.tag)
    problems += teardown_network(rec.tag, sorted(set(rec.netns) | set(ns)), sorted(set(rec.links) | set(links)))
    if not problems:
        rec.path.unlink(missing_ok=True)
        for log in state_dir().glob(f"{rec.tag}-*.log"):
            log.unlink(missing_ok=True)
    return problems


def teardown_stale(tag: str | None = None, mig_teardown: MigTeardown | None = None) -> tuple[list[str], list[str]]:
    """Clean launches whose owner is gone (or the one ``tag`` names), plus prefixed leftovers without a record.

    Returns (tags cleaned, problems). A launch whose owner still runs is left alone unless named.
    """
    cleaned, problems = [], []
    records = {r.tag: r for r in list_records()}
    for t, rec in records.items():
        if t == tag or (tag is None and not rec.owner_alive()):
            problems += teardown_record(rec, mig_teardown)
            cleaned.append(t)
    for t in sorted(leftover_tags()):
        if t in cleaned or (t in records) or (tag is not None and t != tag):
            continue  # done above, or a live launch's resources, or not the one asked for
        problems += teardown_network(t, *_own(t))
        cleaned.append(t)
    return cleaned, problems
