"""TCP echo server and round-trip probe: how the launcher measures the RTT a server's namespace really sees.

``serve`` echoes every byte back (started inside a server namespace on the port the server
would use); ``probe`` opens one connection, sends ``count`` small messages one after another and
times each echo. ``python -m petals_chain.launch.echo serve --listen 127.0.0.1:31337`` and
``python -m petals_chain.launch.echo probe --target 10.213.0.6:31337 --count 20`` (prints JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time

from petals_chain.launch.relay import _owner_gone, parse_hostport

PAYLOAD_BYTES = 64
WARMUP = 2


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo until the peer closes."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(listen: tuple[str, int], owner_pid: int | None) -> None:
    """Run the echo server until cancelled or the owner exits."""
    server = await asyncio.start_server(_echo, *listen, reuse_address=True)
    print(f"ready {listen[0]}:{listen[1]}", flush=True)
    async with server:
        while not _owner_gone(owner_pid):
            await asyncio.sleep(0.5)


def probe(host: str, port: int, count: int = 20, timeout_s: float = 10.0) -> list[float]:
    """Round-trip times (s) of ``count`` echoes over one TCP connection, after WARMUP untimed ones."""
    payload = bytes(range(PAYLOAD_BYTES))
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for i in range(count + WARMUP):
            t0 = time.perf_counter()
            sock.sendall(payload)
            got = b""
            while len(got) < PAYLOAD_BYTES:
                chunk = sock.recv(PAYLOAD_BYTES - len(got))
                if not chunk:
                    raise ConnectionError(f"echo at {host}:{port} closed the connection")
                got += chunk
            if i >= WARMUP:
                rtts.append(time.perf_counter() - t0)
            if got != payload:
                raise ConnectionError(f"echo at {host}:{port} returned different bytes")
    return rtts


def main(argv: list[str] | None = None) -> int:
    """CLI: ``serve --listen H:P`` or ``probe --target H:P --count N`` (JSON ``{"rtt_s": [...]}`` on stdout)."""
    ap = argparse.ArgumentParser(prog="python -m petals_chain.launch.echo", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--listen", required=True)
    s.add_argument("--owner-pid", type=int, default=None)
    p = sub.add_parser("probe")
    p.add_argument("--target", required=True)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--timeout-s", type=float, default=10.0)
    args = ap.parse_args(argv)
    try:
        hp = parse_hostport(args.listen if args.cmd == "serve" else args.target)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.cmd == "serve":
        try:
            asyncio.run(serve(hp, args.owner_pid))
        except KeyboardInterrupt:
            pass
        except OSError as err:
            print(f"error: cannot listen on {args.listen}: {err}", file=sys.stderr)
            return 1
        return 0
    try:
        rtts = probe(*hp, count=args.count, timeout_s=args.timeout_s)
    except OSError as err:
        print(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        return 1
    print(json.dumps({"rtt_s": rtts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
