"""The `genconf` command. With no subcommand it plans (`genconf plan` is the same).

Bad input is one line on stderr and exit code 2; a plan that cannot fit says why and what would.
"""

from __future__ import annotations

import sys

from genconf.cli import commands
from genconf.cli.parser import SUBCOMMANDS, build_parser, check_ranges
from genconf.plan.errors import GenconfError


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "plan")
    try:
        args = build_parser().parse_args(argv)
        check_ranges(args)
        return commands.dispatch(args)
    except GenconfError as exc:
        print(f"genconf: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("genconf: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        # What a path given on the command line can still raise past the checks (a name longer than the filesystem
        # takes, ENAMETOOLONG, was a traceback from the first stat of --model, -o, --cluster, verify RUN, ...).
        print(f"genconf: error: {_os_error_line(exc)}", file=sys.stderr)
        return 2


def _os_error_line(exc: OSError) -> str:
    """'PATH: reason', a path of more than 80 characters cut in the middle with its length."""
    name = exc.filename if exc.filename is not None else ""
    name = str(name)
    if len(name) > 80:
        name = f"{name[:38]}...{name[-38:]} ({len(name):,} characters)"
    reason = exc.strerror or str(exc)
    return f"{name}: {reason}" if name else reason
