"""``ampci completion bash|zsh``: print the shell code that completes ampci's commands, options and model names.

    eval "$(ampci completion bash)"      # in ~/.bashrc; zsh: eval "$(ampci completion zsh)" in ~/.zshrc

The shell code (argcomplete's) runs ``ampci`` on each TAB with the command line in its environment
(``_ARGCOMPLETE``, ``COMP_LINE``, ``COMP_POINT``); :func:`service.cli.main.main` then answers it with
:func:`service.cli.completion.complete` (commands, options, and model names from the zoo and the store).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.cli.main import Subcommands

#: The shells whose completion code ``ampci completion`` prints (argcomplete's ``shellcode``).
SHELLS = ("bash", "zsh")


def register(subparsers: Subcommands) -> None:
    """Add ``ampci completion``."""
    p = subparsers.add_parser("completion", help="print shell code that completes commands, options and models",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in: bash or zsh")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the completion code for ``args.shell`` (to ``eval`` in the shell's start-up file)."""
    from argcomplete.shell_integration import shellcode

    print(shellcode(["ampci"], shell=args.shell), end="")
    return 0
