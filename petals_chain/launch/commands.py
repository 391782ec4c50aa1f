"""Running system commands (ip, tc, nvidia-smi) with errors that say which command failed and what it printed."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence


class CommandError(RuntimeError):
    """A system command exited non-zero (or could not be run); the message shows the command and its stderr."""

    def __init__(self, argv: Sequence[str], returncode: int, output: str) -> None:
        """Keep the command, its exit status and output for callers that inspect them."""
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output
        super().__init__(f"command failed (exit {returncode}): {shlex.join(self.argv)}: {output.strip()[-800:]}")


def run(argv: Sequence[str], *, check: bool = True, timeout_s: float = 60.0,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` (no shell), capture text output; CommandError on failure when ``check``."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, env=env)
    except FileNotFoundError:
        if check:
            raise CommandError(argv, 127, f"{argv[0]}: not found") from None
        return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: not found")
    except subprocess.TimeoutExpired as err:
        raise CommandError(argv, 124, f"timed out after {timeout_s:.0f} s: {err.stderr or ''}") from None
    if check and proc.returncode != 0:
        raise CommandError(argv, proc.returncode, (proc.stderr or "") + (proc.stdout or ""))
    return proc


def show(argv: Sequence[str]) -> str:
    """A command as one copy-pasteable shell line."""
    return shlex.join(list(argv))
