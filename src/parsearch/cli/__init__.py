"""Command-line entry point: ``parsearch <command> ...``.

Each command lives in its own module with ``register(subparsers)``; this
module only wires them together and turns :class:`ParsearchError` into one
line on stderr and exit code 2 (``shared/spec/cli.md``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from parsearch import __version__
from parsearch.errors import ParsearchError

# One module per command (group), each with ``register(subparsers)``.
COMMAND_MODULES: tuple[str, ...] = (
    "models_cmd",
    "show_model_cmd",
    "layouts_cmd",
    "check_cmd",
    "topology_cmds",
    "cost_cmds",
    "search_cmds",
    "sweep_cmd",
    "calibrate_cmds",
    "serve_cmd",
)


def command_modules() -> list[ModuleType]:
    """The command modules, in the order ``--help`` lists them."""
    return [importlib.import_module(f"parsearch.cli.{name}") for name in COMMAND_MODULES]


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every registered command."""
    parser = OneLineErrorParser(
        prog="parsearch",
        description="Find the best parallel layout for training a transformer on a GPU cluster.",
    )
    parser.add_argument("--version", action="version", version=f"parsearch {__version__}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=OneLineErrorParser
    )
    subparsers.required = True
    for module in command_modules():
        module.register(subparsers)
    from parsearch.cli.input_checks import check_parser_inputs

    check_parser_inputs(parser)  # bounds, finite floats, seeds, output files, storage URLs
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except ParsearchError as error:
        print(f"parsearch {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `parsearch layouts ... | head`
        return 0
    except KeyboardInterrupt:
        print(f"parsearch {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
