"""Command line: ``python -m harness COMMAND [arguments]``.

Parses the command's name and hands the rest of the command line to its module,
:mod:`harness.commands.<name>` (imported only then, so ``--help`` imports nothing heavy).
"""

from __future__ import annotations

import importlib
import sys
import warnings

from harness.commands import COMMANDS

# Our launcher presets share their names with the plugins' structured configs on purpose
# (`hydra/launcher=joblib`); Hydra 1.3 warns about the name match. Set at import time so
# that launcher worker processes, which import the commands, inherit it.
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema")

USAGE = (
    "usage: python -m harness COMMAND [overrides...]\n\ncommands:\n"
    + "".join(f"  {name:<11} {line}\n" for name, line in COMMANDS.items())
    + """
Overrides are Hydra's: optim.lr=0.05 clip.max_norm=1 iterations=50 device=cpu seed=3;
-m sweeps, e.g. -m clip.max_norm=0.1,1,10.
"""
)


def main(argv: list[str] | None = None) -> None:
    """Run one command (``argv``: the command line after ``python -m harness``)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return
    command, rest = argv[0], argv[1:]
    from harness import environment_error

    problem = environment_error()
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    if command not in COMMANDS:
        print(f"error: command: '{command}' is not one of {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    importlib.import_module(f"harness.commands.{command}").main(rest)
