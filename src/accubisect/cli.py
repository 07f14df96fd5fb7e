"""`accubisect`: the library's stages for work outside the workflow, on files a run already made.

    accubisect compare REFERENCE.h5 CANDIDATE.h5 [--graph graph.json] [--rtol R --atol A --ntol N --cos-sim C]
    accubisect judge REPORT.json [--ntol N] [--cos-sim C]
    accubisect show DUMP.h5
    accubisect rules MODEL.onnx [--level all] [--backend ort-cpu] [--session-config KEY=VALUE ...]
    accubisect reproduce BUNDLE.tar.gz
    accubisect workspace prune [--workspace DIR] [--older-than DAYS] [--keep-config CONFIG] [--dry-run]

`compare` and `judge` exit 1 when the candidate's model outputs fail the check, 0 when they pass;
`reproduce` exits 1 when the re-run comparison differs from the bundled report; every command
exits 2 with a one-line message on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import yaml
from collections.abc import Sequence
from pathlib import Path

from accubisect.backends import BACKENDS, CPU, backend_named
from accubisect.bundle import reproduce
from accubisect.catalogue import installed_catalogue
from accubisect.accuracy import Tolerance
from accubisect.compare import build_report, graph_from_dump, judge_report
from accubisect.compile_stage import Variant, compile_and_find_rules
from accubisect.config import load_schema
from accubisect.dump import DumpReader, statistics
from accubisect.errors import AccubisectError, ConfigError, DumpError
from accubisect.graph import load_graph
from accubisect.plan import Plan
from accubisect.report_text import render_summary
from accubisect.workspace import needed_keys, prune

DEFAULTS = load_schema()["properties"]["accuracy"]["properties"]


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        return arguments.command(arguments)
    except AccubisectError as error:
        print(f"accubisect: {error}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accubisect", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    compare = commands.add_parser("compare", help="compare two dumps op by op")
    compare.add_argument("reference", type=Path)
    compare.add_argument("candidate", type=Path)
    compare.add_argument("--graph", type=Path, help="the candidate's graph.json (names the rule behind each node)")
    for name in ("rtol", "atol", "ntol"):
        compare.add_argument(f"--{name}", type=float, default=DEFAULTS[name]["default"],
                             help=DEFAULTS[name]["description"])
    compare.add_argument("--cos-sim", type=float, dest="cosine", help=DEFAULTS["cosine"]["description"])
    compare.set_defaults(command=_compare)
    judge = commands.add_parser("judge", help="judge a saved compare report again with other thresholds")
    judge.add_argument("report", type=Path)
    judge.add_argument("--ntol", type=float, help=DEFAULTS["ntol"]["description"])
    judge.add_argument("--cos-sim", type=float, dest="cosine", help=DEFAULTS["cosine"]["description"])
    judge.set_defaults(command=_judge)
    show = commands.add_parser("show", help="list a dump's tensors with shapes and statistics")
    show.add_argument("dump", type=Path)
    show.set_defaults(command=_show)
    rules = commands.add_parser("rules", help="which fusion rules fire on a model")
    rules.add_argument("model", type=Path)
    rules.add_argument("--level", choices=["basic", "extended", "all"], default="all")
    rules.add_argument("--backend", choices=sorted(BACKENDS), default=CPU.name)
    rules.add_argument("--session-config", action="append", default=[], metavar="KEY=VALUE")
    rules.set_defaults(command=_rules)
    again = commands.add_parser("reproduce", help="re-run a bundled comparison and check it bit for bit")
    again.add_argument("bundle", type=Path)
    again.set_defaults(command=_reproduce)
    workspace = commands.add_parser("workspace", help="manage the workspace").add_subparsers(required=True)
    prune = workspace.add_parser("prune", help="remove stage folders that are old or not needed")
    prune.add_argument("--workspace", type=Path, default=Path("workspace"))
    prune.add_argument("--older-than", type=float, metavar="DAYS", help="remove folders not touched for DAYS")
    prune.add_argument("--keep-config", type=Path, metavar="CONFIG",
                       help="remove folders this workflow config does not need (run where the workflow runs)")
    prune.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    prune.set_defaults(command=_prune)
    return parser


def _compare(arguments: argparse.Namespace) -> int:
    accuracy = {"rtol": arguments.rtol, "atol": arguments.atol, "ntol": arguments.ntol, "cosine": arguments.cosine,
                "val_func": None}
    with DumpReader(arguments.reference) as reference, DumpReader(arguments.candidate) as candidate:
        graph = load_graph(arguments.graph) if arguments.graph else graph_from_dump(candidate)
        labels = [str(dump.attrs.get("variant", path.name)) for dump, path in
                  ((reference, arguments.reference), (candidate, arguments.candidate))]
        outputs, sample = candidate.output_names(), str(candidate.attrs.get("sample", "sample"))
    report = build_report([str(arguments.reference)], [str(arguments.candidate)], graph, labels, [""],
                          [sample], outputs, accuracy, "fp16")
    print(render_summary(report), end="")
    return 0 if report["passed"] else 1


def _judge(arguments: argparse.Namespace) -> int:
    try:
        report = json.loads(arguments.report.read_text())
    except (OSError, ValueError) as error:
        raise DumpError(f"{arguments.report}: not a readable compare report ({error})") from None
    measured = report["accuracy"]
    tolerance = Tolerance(measured["rtol"], measured["atol"],
                          measured["ntol"] if arguments.ntol is None else arguments.ntol,
                          measured["cosine"] if arguments.cosine is None else arguments.cosine)
    report = judge_report(report, tolerance)
    print(render_summary(report), end="")
    return 0 if report["passed"] else 1


def _reproduce(arguments: argparse.Namespace) -> int:
    outcome = reproduce(arguments.bundle)
    print(render_summary(outcome.report), end="")
    for library, (bundled, here) in outcome.versions.items():
        print(f"note: {library} {here} here, {bundled} where the bundle was made")
    if outcome.matches:
        print(f"reproduced bit for bit: the report equals the one in {arguments.bundle}")
        return 0
    print(f"NOT reproduced: {outcome.difference}")
    return 1


def _prune(arguments: argparse.Namespace) -> int:
    if arguments.older_than is None and arguments.keep_config is None:
        raise ConfigError("workspace prune: give --older-than DAYS, --keep-config CONFIG, or both")
    keep = None
    if arguments.keep_config is not None:
        config = {**yaml.safe_load(arguments.keep_config.read_text()), "workspace": str(arguments.workspace)}
        keep = needed_keys(Plan.from_config(config))
    removals = prune(arguments.workspace, arguments.older_than, keep, arguments.dry_run)
    verb = "would remove" if arguments.dry_run else "removed"
    for removal in removals:
        print(f"{verb} {removal.path} ({removal.bytes / 2**20:.1f} MiB, {removal.why})")
    total = sum(removal.bytes for removal in removals) / 2**20
    print(f"{len(removals)} item(s), {total:.1f} MiB {'would be freed' if arguments.dry_run else 'freed'}")
    return 0


def _show(arguments: argparse.Namespace) -> int:
    with DumpReader(arguments.dump) as dump:
        print(", ".join(f"{key}={value}" for key, value in sorted(dump.attrs.items())))
        print(f"{'#':>4}  {'tensor':<32} {'op_type':<20} {'shape':<16} {'dtype':<8} {'min':>10} {'max':>10} "
              f"{'mean':>10} {'nan':>5} {'inf':>5}")
        for name in sorted(dump.names(), key=lambda n: int(dump.info(n)["topo_index"])):
            info = dump.info(name)
            stats = info if dump.statistics_only else statistics(dump.read(name))
            shape = "x".join(str(d) for d in info["shape"]) or "scalar"
            print(f"{int(info['topo_index']):>4}  {name[:32]:<32} {str(info['op_type'])[:20]:<20} {shape[:16]:<16} "
                  f"{info['dtype']:<8} {stats['min']:>10.4g} {stats['max']:>10.4g} {stats['mean']:>10.4g} "
                  f"{int(stats['nan']):>5} {int(stats['inf']):>5}")
    return 0


def _rules(arguments: argparse.Namespace) -> int:
    entries = dict(item.partition("=")[::2] for item in arguments.session_config)
    variant = Variant("fusion_on", arguments.level, entries)
    catalogue, backend = installed_catalogue(), backend_named(arguments.backend)
    backend.check_installed()
    with tempfile.TemporaryDirectory() as folder:
        fired = compile_and_find_rules(arguments.model, variant, catalogue, backend, Path(folder) / "model.onnx")
    for rule in fired:
        print(f"{rule:<36} {catalogue.section_of(rule)}")
    if not fired:
        print("no fusion rule fires on this model at level", arguments.level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
