"""The `genconf` command. With no subcommand it plans (`genconf plan` is the same).

Bad input is one line on stderr and exit code 2; a plan that cannot fit says why and what would.
"""

from __future__ import annotations

import sys

from genconf.cli import commands
from genconf.cli.parser import SUBCOMMANDS, build_parser
from genconf.plan.errors import GenconfError


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "plan")
    try:
        args = build_parser().parse_args(argv)
        return commands.dispatch(args)
    except GenconfError as exc:
        print(f"genconf: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("genconf: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
