"""`llmpar ui [SPEC]`: the planner as a local web page (docs/ui.md)."""

from __future__ import annotations

import argparse
import sys

from llmpar.cli.common import spec_source
from llmpar.loading.reader import existing_file
from llmpar.session import Session

EXIT_CANNOT_LISTEN = 1
"""The address is taken, or not this machine's."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "ui", help="plan in a web page on this machine",
        description="Start a local web page that edits a spec (TOML and a form of "
                    "every key of the spec schema) and shows its plan and searches, "
                    "computed by llmpar. It listens on 127.0.0.1 and answers this "
                    "machine only unless --host is given; it reads no file but the "
                    "presets and SPEC. Ctrl-C stops it.")
    parser.add_argument("spec", nargs="?",
                        help="a spec file (TOML) or the name of a shipped example to start "
                             "from (llmpar presets examples)")
    parser.add_argument("--port", type=int, default=0,
                        help="the port to listen on (default: a free one)")
    parser.add_argument("--host", metavar="ADDR",
                        help="listen on ADDR (e.g. 0.0.0.0) and answer other machines too; "
                             "anyone who reaches it can run evaluations and searches")
    parser.add_argument("--no-browser", action="store_true",
                        help="print the address without opening a browser")
    parser.set_defaults(run=run)


def initial_spec(session: Session, spec: str | None) -> dict[str, str]:
    """The page's first spec: SPEC's TOML text and its name, or nothing. A spec that
    does not load still opens, with its problems beside the fields."""
    if spec is None:
        return {}
    source = spec_source(session, spec)
    path = existing_file(str(source)) if not isinstance(source, dict) else None
    if path is None:
        from llmpar.errors import Problem, SpecError

        raise SpecError([Problem("$", "expected a spec file or the name of a shipped "
                                      "example (llmpar presets examples)")], spec)
    return {"toml": path.read_text(encoding="utf-8"), "label": path.name}


def run(session: Session, args: argparse.Namespace) -> int:
    from llmpar.ui.server import make_server

    initial = initial_spec(session, args.spec)
    host = args.host or "127.0.0.1"
    try:
        server = make_server(session, initial, host=host, port=args.port,
                             allow_remote=args.host is not None)
    except (OSError, OverflowError) as error:
        print(f"llmpar ui: cannot listen on {host} port {args.port}: {error}",
              file=sys.stderr)
        return EXIT_CANNOT_LISTEN
    print(f"llmpar ui: {server.url} (Ctrl-C stops it)", flush=True)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("llmpar ui: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
