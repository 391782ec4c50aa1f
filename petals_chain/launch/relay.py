"""A user-space delaying TCP relay: forwards each direction of every connection after a fixed one-way delay.

Used where the kernel has no ``sch_netem``: one relay runs inside each server's namespace on the
address the swarm is told about and forwards to the server's real (loopback) address, holding
every chunk for ``delay`` seconds before writing it on, in order, in both directions. A client's
round trip through it therefore grows by 2 × delay = the configured RTT. Only payload is delayed:
the TCP handshake with the relay itself is immediate. Run:
``python -m petals_chain.launch.relay --listen 10.213.0.6:31337 --target 127.0.0.1:31337 --delay-ms 12.5``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
import time
from collections import deque

CHUNK_BYTES = 65536
ACCEPT_POLL_S = 0.5


def parse_hostport(text: str) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port); ValueError naming the text otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _nodelay(sock: socket.socket) -> None:
    """Disable Nagle so small messages are not held back on top of the emulated delay."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _pipe(src: socket.socket, dst: socket.socket, delay_s: float) -> threading.Thread:
    """Copy src → dst in two threads: the reader stamps each chunk, the writer sends it ``delay_s`` later, in order.

    Threads with ``time.sleep`` (nanosecond timer) rather than an event loop, whose waits are
    rounded up to whole milliseconds. Returns the writer thread (done when EOF has been passed on).
    """
    queue: deque[tuple[float, bytes]] = deque()
    ready = threading.Condition()

    def reader() -> None:
        """Read chunks as they come and queue them with their due time (EOF too)."""
        while True:
            try:
                data = src.recv(CHUNK_BYTES)
            except OSError:
                data = b""
            with ready:
                queue.append((time.monotonic() + delay_s, data))
                ready.notify()
            if not data:
                return

    def writer() -> None:
        """Send each queued chunk at its due time; pass EOF on as a half-close."""
        while True:
            with ready:
                while not queue:
                    ready.wait()
                due, data = queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                with contextlib.suppress(OSError):
                    src.shutdown(socket.SHUT_RD)  # stop the reader too: nobody takes its data any more
                return

    threading.Thread(target=reader, daemon=True).start()
    w = threading.Thread(target=writer, daemon=True)
    w.start()
    return w


def _handle(client: socket.socket, target: tuple[str, int], delay_s: float) -> None:
    """One relayed connection: connect upstream, pipe both directions, close both ends when both are done."""
    try:
        upstream = socket.create_connection(target, timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    for sock in (client, upstream):
        _nodelay(sock)
    writers = [_pipe(client, upstream, delay_s), _pipe(upstream, client, delay_s)]
    for w in writers:
        w.join()
    for sock in (client, upstream):
        sock.close()


def _owner_gone(owner_pid: int | None) -> bool:
    """True once the owner process has exited (a crashed launcher must not leave relays behind)."""
    if owner_pid is None:
        return False
    try:
        os.kill(owner_pid, 0)
    except ProcessLookupError:
        return True
    return False


def listen_socket(listen: tuple[str, int]) -> socket.socket:
    """A listening TCP socket on ``listen`` (SO_REUSEADDR, accept timeout for the owner check)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(listen)
    srv.listen(128)
    srv.settimeout(ACCEPT_POLL_S)
    return srv


def serve(listen: tuple[str, int], target: tuple[str, int], delay_s: float, owner_pid: int | None) -> None:
    """Relay connections from ``listen`` to ``target`` until interrupted (or the owner exits)."""
    with listen_socket(listen) as srv:
        print(f"ready {listen[0]}:{listen[1]} -> {target[0]}:{target[1]} delay {delay_s * 1e3:.3f} ms", flush=True)
        while not _owner_gone(owner_pid):
            try:
                client, _ = srv.accept()
            except socket.timeout:
                continue
            client.settimeout(None)
            threading.Thread(target=_handle, args=(client, target, delay_s), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exit 2 on bad arguments."""
    ap = argparse.ArgumentParser(prog="python -m petals_chain.launch.relay", description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True, help="HOST:PORT to accept connections on")
    ap.add_argument("--target", required=True, help="HOST:PORT to forward them to")
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way delay per direction (half the RTT)")
    ap.add_argument("--owner-pid", type=int, default=None, help="exit when this process is gone")
    args = ap.parse_args(argv)
    try:
        listen, target = parse_hostport(args.listen), parse_hostport(args.target)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not args.delay_ms >= 0:
        print(f"error: --delay-ms must be >= 0, got {args.delay_ms}", file=sys.stderr)
        return 2
    try:
        serve(listen, target, args.delay_ms * 1e-3, args.owner_pid)
    except KeyboardInterrupt:
        pass
    except OSError as err:
        print(f"error: cannot relay {args.listen} -> {args.target}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
