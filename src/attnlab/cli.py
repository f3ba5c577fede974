"""The ``attnlab`` command.

``attnlab list`` prints every registered mechanism with its formula, cost and source.
``attnlab explain`` builds an :class:`attnlab.Attention` from options and says which
implementation path it takes and why.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence

from attnlab import registry

KIND_TITLES = {
    "score": "Score functions (survey 3.2.1)",
    "align": "Alignment functions (survey 3.2.2)",
    "dim": "Attention dimensionality (survey 3.2.3)",
    "attention": "Attention modules",
    "feature": "Feature-related attention (survey 3.1)",
    "query": "Query-related attention (survey 3.3)",
    "model": "Task models (survey section 0: feature, query, attention and output model)",
}


def _cmd_list(args: argparse.Namespace) -> int:
    entries = registry.entries(args.kind)
    if args.json:
        rows = [
            {
                "kind": e.kind,
                "name": e.name,
                "aliases": list(e.aliases),
                "formula": e.formula,
                "cost": e.cost,
                "source": e.source,
                "class": f"{e.cls.__module__}.{e.cls.__qualname__}",
            }
            for e in entries
        ]
        print(json.dumps(rows, indent=2))
        return 0
    # the survey's order (score, align, dim, attention), then any later kinds
    kinds = [k for k in KIND_TITLES if any(e.kind == k for e in entries)]
    for e in entries:
        if e.kind not in kinds:
            kinds.append(e.kind)
    for kind in kinds:
        title = KIND_TITLES.get(kind, kind)
        print(f"{title}\n{'=' * len(title)}")
        for e in (x for x in entries if x.kind == kind):
            alias = f"  (aliases: {', '.join(e.aliases)})" if e.aliases else ""
            print(f"{e.name}{alias}")
            print(textwrap.indent(f"formula: {e.formula}", "    "))
            if e.cost:
                print(textwrap.indent(f"cost:    {e.cost}", "    "))
            print(textwrap.indent(f"source:  {e.source}", "    "))
        print()
    return 0


def _parse_value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _cmd_explain(args: argparse.Namespace) -> int:
    from attnlab import Attention

    options = {}
    for item in args.option or []:
        if "=" not in item:
            print(f"error: --option expects KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        key, value = item.split("=", 1)
        options[key] = _parse_value(value)
    try:
        attn = Attention(
            score=args.score, align=args.align, dim=args.dim, d_q=args.d_q, d_k=args.d_k, **options
        )
    except (ValueError, TypeError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    path, reason = attn.explain(need_weights=args.need_weights)
    print(f"path:   {path}\nreason: {reason}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab", description="Attention mechanisms of the survey literature."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="list every registered mechanism")
    kinds = sorted(set(KIND_TITLES) | {e.kind for e in registry.entries()})
    p_list.add_argument("--kind", choices=kinds, help="only this kind")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    p_list.set_defaults(func=_cmd_list)
    p_exp = sub.add_parser("explain", help="which implementation path an attention takes")
    p_exp.add_argument("--score", default="scaled-dot")
    p_exp.add_argument("--align", default="soft")
    p_exp.add_argument("--dim", default="single")
    p_exp.add_argument("--d-q", type=int, default=64)
    p_exp.add_argument("--d-k", type=int, default=64)
    p_exp.add_argument("--need-weights", action="store_true")
    p_exp.add_argument("--option", action="append", metavar="KEY=VALUE", help="score/align option")
    p_exp.set_defaults(func=_cmd_explain)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # e.g. `attnlab list | head`: the reader went away
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
