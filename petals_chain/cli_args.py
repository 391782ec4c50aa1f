"""Argparse pieces every command line shares: one-line errors (exit code 2) and numeric option types with ranges.

A number given on a command line is checked where it is parsed, so ``--port 99999``, ``--lease-ttl-s nan`` or
``--c 0`` never reach the code that would misbehave on them: argparse reports ``argument --port: must be an integer
in 0..65535, got '99999'`` on one line and exits with code 2, like every other bad input (README, "Composing a
cluster"). Sizes and durations take units through :mod:`petals_chain.units`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from petals_chain.units import UnitError, parse_duration, parse_number, parse_size

EXIT_BAD_INPUT = 2
MAX_PORT = 65535


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (``prog: error: ...``) and exit code 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        """Print ``prog: error: message (see --help)`` on one line and exit with code 2."""
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def _range_text(gt: float | None, ge: float | None, le: float | None) -> str:
    """``> 0``, ``>= 1``, ``in (0, 1]``, ``in 0..65535``: the range a value must lie in, as words."""
    if gt is not None and le is not None:
        return f"in ({gt:g}, {le:g}]"
    if ge is not None and le is not None:
        return f"in {ge:g}..{le:g}"
    if gt is not None:
        return f"> {gt:g}"
    return f">= {ge:g}" if ge is not None else f"<= {le:g}"


def _check(number: float, text: str, gt: float | None, ge: float | None, le: float | None) -> None:
    """UnitError unless ``number`` lies in the range (gt: exclusive lower bound, ge and le: inclusive)."""
    if (gt is not None and not number > gt) or (ge is not None and not number >= ge) or (
            le is not None and not number <= le):
        raise UnitError(f"must be {_range_text(gt, ge, le)}, got {text!r}")


def _argtype(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """An argparse ``type=`` calling ``parse`` and turning its UnitError into argparse's error naming the option."""

    def convert(text: str) -> Any:
        """The parsed value, or argparse's one-line error naming the option."""
        try:
            return parse(text)
        except UnitError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name  # argparse names the type in some messages
    return convert


def int_arg(*, ge: int | None = None, le: int | None = None, name: str = "integer") -> Callable[[str], int]:
    """An integer option within ``[ge, le]`` (either end open when None); ``1.5``, ``1e3`` and ``nan`` refused."""

    def parse(text: str) -> int:
        """The integer written in ``text``, range-checked."""
        try:
            value = int(text.strip())
        except ValueError:
            raise UnitError(f"must be an integer, got {text!r}") from None
        if (ge is not None and value < ge) or (le is not None and value > le):
            raise UnitError(f"must be an integer {_range_text(None, ge, le)}, got {text!r}")
        return value

    return _argtype(parse, name)


def _bounded(base: Callable[[Any], float], name: str, gt: float | None, ge: float | None,
             le: float | None) -> Callable[[str], float]:
    """An argparse type parsing with ``base`` (finite by construction) then range-checking."""

    def parse(text: str) -> float:
        """The number ``base`` reads from ``text``, range-checked."""
        number = base(text)
        _check(number, text, gt, ge, le)
        return number

    return _argtype(parse, name)


def float_arg(*, gt: float | None = None, ge: float | None = None, le: float | None = None) -> Callable[[str], float]:
    """A finite number within the bounds (gt exclusive, ge/le inclusive); NaN and infinities refused."""
    return _bounded(parse_number, "number", gt, ge, le)


def duration_range(*, gt: float | None = None, ge: float | None = 0.0,
                   le: float | None = None) -> Callable[[str], float]:
    """Seconds from a duration with units (``500ms``, ``2min``; a bare number is seconds), within the bounds."""
    return _bounded(parse_duration, "duration", gt, ge, le)


def size_range(*, gt: float | None = None, ge: float | None = 0.0,
               le: float | None = None) -> Callable[[str], float]:
    """Bytes from a size with units (``350MB``, ``1.5GiB``; a bare number is bytes), within the bounds."""
    return _bounded(parse_size, "size", gt, ge, le)


def checked_text(parse: Callable[[str], Any], name: str) -> Callable[[str], str]:
    """An argparse type that checks ``text`` with ``parse`` (one-line error) but keeps it as written, for code
    that parses it again and quotes it in its own messages (``--memory-budget 20GB``)."""

    def check(text: str) -> str:
        """``text`` unchanged, once ``parse`` accepts it."""
        parse(text)
        return text

    return _argtype(check, name)


port_arg = int_arg(ge=0, le=MAX_PORT, name="port")  # a TCP port; 0 lets the system pick a free one
positive_int_arg = int_arg(ge=1, name="positive integer")
count_arg = int_arg(ge=0, name="count")
fraction_arg = float_arg(gt=0.0, le=1.0)  # a utilisation such as ρ̄
positive_float_arg = float_arg(gt=0.0)



# ---- credentials ---------------------------------------------------------------------------------------------

TOKEN_FLAG_WARNING = ("%s given on the command line: every local user can read it (ps, /proc/PID/cmdline); give it "
                      "in a file (%s) or an environment variable instead")
_warned_token_flags = False  # the warning is logged once per process


def _read_token_file(path: str) -> str:
    """The token in ``path``: its first line without surrounding whitespace; UnitError (argparse's one-line error
    naming the option) when the file cannot be read or holds no token."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UnitError(f"cannot read the token file {path!r}: {exc}") from None
    if not token:
        raise UnitError(f"the token file {path!r} is empty (its first line is the token)")
    return token


def add_token_option(parser: Any, flag: str, help: str) -> None:
    """``flag`` (e.g. ``--token``) and ``flag-file``: a bearer token on the command line, or the first line of a file
    (which, unlike the command line, other local users cannot read); at most one of the two."""
    dest = flag.lstrip("-").replace("-", "_")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(flag, dest=dest, default=None, metavar="TOKEN",
                       help=f"{help}. Visible to every local user (ps): prefer {flag}-file or the variable")
    group.add_argument(flag + "-file", dest=dest + "_file", default=None, metavar="FILE",
                       type=_argtype(_read_token_file, "token file"),
                       help=f"read {flag} from the first line of FILE (keep it private: chmod 600)")


def token_files(args: argparse.Namespace, *flags: str) -> argparse.Namespace:
    """Fill each token option from its ``-file`` twin (parse_args calls it: the rest of the program sees one value)."""
    for flag in flags:
        dest = flag.lstrip("-").replace("-", "_")
        if getattr(args, dest + "_file", None) is not None:
            setattr(args, dest, getattr(args, dest + "_file"))
    return args


def warn_token_flags(args: argparse.Namespace, *flags: str, log: Any = None) -> list[str]:
    """Log one warning (once per process) naming the token options given on the command line itself, where other
    local users can read them; return those options. Call it once logging is configured."""
    global _warned_token_flags
    given = [f for f in flags if getattr(args, f.lstrip("-").replace("-", "_"), None) is not None
             and getattr(args, f.lstrip("-").replace("-", "_") + "_file", None) is None]
    if given and not _warned_token_flags:
        import logging

        _warned_token_flags = True
        (log or logging.getLogger(__name__)).warning(TOKEN_FLAG_WARNING, "/".join(given),
                                                     "/".join(f + "-file" for f in given))
    return given
