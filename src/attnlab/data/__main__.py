"""``python -m attnlab.data debtags freeze|stats``: the data layer's set-up commands.

Run through the package (not ``python -m attnlab.data.debtags``) because ``attnlab.data``
imports its loaders, and running a module that its package has already imported makes
Python warn that it may behave unpredictably.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

COMMANDS: dict[str, str] = {
    "debtags": "freeze the Debian apt lists' debtags (freeze [DEST]) or print counts (stats)",
}


def _command(name: str) -> Callable[[Sequence[str]], int]:
    if name == "debtags":
        from attnlab.data.debtags import main as debtags_main

        return debtags_main
    raise KeyError(name)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        out = sys.stdout if args and args[0] in ("-h", "--help") else sys.stderr
        print("usage: python -m attnlab.data COMMAND ...", file=out)
        for name, text in COMMANDS.items():
            print(f"  {name:10s}{text}", file=out)
        if args and args[0] not in ("-h", "--help"):
            print(f"error: unknown command {args[0]!r}", file=out)
        return 0 if out is sys.stdout else 2
    return _command(args[0])(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
