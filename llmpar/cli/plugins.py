"""`llmpar plugins`: loaded plugins, their distributions, versions, strategies and workloads."""

from __future__ import annotations

import argparse

import attrs

from llmpar.cli.output import add_format_argument, print_json, print_tables
from llmpar.plugins import PluginInfo
from llmpar.report.tables import Table
from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "plugins", help="list plugins: versions, strategies, loaded, broken or blocked",
        description="List plugins, their distributions, strategies (and workloads, as "
                    "workload.<name>) and status; a broken one is shown with its error.")
    add_format_argument(parser, "; plugins: name, distribution, version, status, "
                                "strategies, error, workloads")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    if args.format == "json":
        print_json({"plugins": [attrs.asdict(info) for info in session.plugins()]})
        return 0
    if args.format in ("markdown", "rich"):
        rows = tuple((i.name, i.distribution, i.version, i.status,
                      _offers(i), i.error or "")
                     for i in session.plugins())
        print_tables([Table(title="Plugins", columns=("plugin", "distribution", "version",
                                                      "status", "strategies", "error"),
                            rows=rows, text_columns=(0, 1, 2, 3, 4, 5))], args.format)
        return 0
    print(f"{'plugin':<16}{'distribution':<24}{'version':<12}{'status':<10}strategies")
    broken = []
    for info in session.plugins():
        strategies = _offers(info)
        print(f"{info.name:<16}{info.distribution:<24}{info.version:<12}{info.status:<10}"
              f"{strategies}")
        if info.error:
            broken.append(f"{info.name}: {info.error}")
    if broken:
        print("\nbroken plugins (set aside; specs that need them fail, the rest work):")
        print("\n".join(f"  {line}" for line in broken))
    return 0


def _offers(info: PluginInfo) -> str:
    """Its strategies, then its workloads as `workload.<name>`."""
    offered = [*info.strategies, *(f"workload.{name}" for name in info.workloads)]
    return ", ".join(offered) or "-"
