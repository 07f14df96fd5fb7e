"""`accubisect`: the workflow run in your own folder, and the library's stages on files a run already made.

    accubisect run TARGET [--model M --samples S] [--configfile F] [--profile local|slurm|DIR] [snakemake args...]
    accubisect init
    accubisect compare REFERENCE.h5 CANDIDATE.h5 [--graph graph.json] [--rtol R --atol A --ntol N --cos-sim C]
    accubisect judge REPORT.json [--ntol N] [--cos-sim C]
    accubisect show DUMP.h5
    accubisect rules MODEL.onnx [--level all] [--backend ort-cpu] [--session-config KEY=VALUE ...]
    accubisect reproduce BUNDLE.tar.gz [--trust-bundle-code]
    accubisect workspace prune [--workspace DIR] [--older-than DAYS] [--keep-config CONFIG] [--delete]
    accubisect explorer-data REPORT.json [--model MODEL.onnx] [-o node_data.json]

`compare` and `judge` exit 1 when the candidate's model outputs fail the check, 0 when they pass;
`reproduce` exits 1 when the re-run comparison differs from the bundled report; every command
exits 2 with a one-line message on bad input.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import onnx
import yaml

from accubisect.core.accuracy import AccuracyCheck
from accubisect.core.errors import AccubisectError, ConfigError, DumpError, GraphError, ModelError, UsageError
from accubisect.formats.compare_report import CompareReport
from accubisect.formats.compile_record import Variant
from accubisect.formats.config import load_schema, validate_config
from accubisect.formats.digest import file_sha256
from accubisect.formats.dump_file import DumpReader, statistics
from accubisect.formats.files import write_json
from accubisect.formats.graph_record import GraphRecord
from accubisect.formats.model import load_model
from accubisect.reports.model_explorer import node_data
from accubisect.reports.report_text import render_summary
from accubisect.runtime.backends import BACKENDS, CPU, FUSION_RULES, backend_named
from accubisect.runtime.catalogue import installed_catalogue
from accubisect.runtime.session_config import check_session_config
from accubisect.stages.bundle import TRUST_FLAG, reproduce, shape_problem
from accubisect.stages.compare import (
    Compared,
    build_report,
    graph_from_dump,
    judge_report,
)
from accubisect.stages.compile_stage import Compiler
from accubisect.workflow.packaged import LOCAL, PROJECT_CONFIG, RunRequest, snakemake_command
from accubisect.workflow.plan import Plan
from accubisect.workflow.starter_config import write_starter_config
from accubisect.workflow.workspace import (
    check_unlocked,
    check_workspace,
    needed_keys,
    removals,
    remove,
)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        arguments = _Parser(prog="accubisect", description=__doc__.splitlines()[0]).with_commands().parse_args(argv)
        code = arguments.command(arguments)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return code
    except AccubisectError as error:
        print(f"accubisect: {'; '.join(str(error).splitlines())}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `accubisect show DUMP | head`: the reader left; as the Python docs recommend
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


class _Parser(argparse.ArgumentParser):
    """Usage errors in the same one line as every other bad input, rather than argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def parse_args(self, args: Sequence[str] | None = None,
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """An unknown argument is an error, except to `run`, which hands what it does not know to snakemake."""
        arguments, unknown = self.parse_known_args(args, namespace)
        if unknown and not hasattr(arguments, "snakemake_args"):
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        if unknown:
            arguments.snakemake_args = tuple(unknown)
        return arguments

    def with_commands(self) -> _Parser:
        commands = self.add_subparsers(required=True, metavar="COMMAND")
        for add in (_add_run, _add_init, _add_compare, _add_judge, _add_show, _add_rules, _add_reproduce,
                    _add_workspace, _add_explorer_data):
            add(commands)
        return self


def _number(low: float, high: float) -> Callable[[str], float]:
    """An argparse type for a finite number within [low, high]: NaN would pass or fail everything silently."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high):
            within = f">= {low:g}" if high == math.inf else f"from {low:g} to {high:g}"
            raise argparse.ArgumentTypeError(f"{text!r} is not a number {within}")
        return value
    return parse


@functools.cache
def _accuracy_keys() -> dict[str, Any]:
    """The schema's accuracy keys (bounds, defaults, descriptions), read when a parser is built, not at import."""
    return load_schema()["properties"]["accuracy"]["properties"]


def _tolerance(name: str) -> Callable[[str], float]:
    bounds = _accuracy_keys()[name]
    return _number(bounds.get("minimum", -math.inf), bounds.get("maximum", math.inf))


def _add_run(commands: argparse._SubParsersAction) -> None:
    # allow_abbrev=False: snakemake's --config must reach snakemake, not be read as our --configfile
    run = commands.add_parser("run", allow_abbrev=False, help="run a workflow target in this folder (the packaged "
                              "workflow; arguments it does not know go to snakemake)",
                              usage="%(prog)s TARGET [--model M --samples S] [--configfile F] [--profile "
                                    "local|slurm|DIR] [snakemake args...]",
                              epilog="Arguments run does not know go to snakemake as they are (-n, --cores 4, more "
                                     "targets, --config KEY=VALUE); put TARGET first. docs/your-project.md")
    run.add_argument("target", metavar="TARGET", help="e.g. compare, fusion_bisect, precision_bisect, reduce")
    run.add_argument("--model", help="the ONNX model (--config model=MODEL)")
    run.add_argument("--samples", help="the samples folder (--config samples=FOLDER)")
    run.add_argument("--configfile", type=Path, help=f"the project's config (default: ./{PROJECT_CONFIG} where "
                     "there is one)")
    run.add_argument("--profile", default=LOCAL, help="a profile accubisect carries (local: every core here; "
                     "slurm: one SLURM job per job) or your profile's folder (default: %(default)s)")
    run.set_defaults(command=_run, snakemake_args=())


def _add_init(commands: argparse._SubParsersAction) -> None:
    init = commands.add_parser("init", help=f"write ./{PROJECT_CONFIG}: every key at its default, commented")
    init.set_defaults(command=_init)


def _add_compare(commands: argparse._SubParsersAction) -> None:
    compare = commands.add_parser("compare", help="compare two dumps op by op")
    compare.add_argument("reference", type=Path)
    compare.add_argument("candidate", type=Path)
    compare.add_argument("--graph", type=Path, help="the candidate's graph.json (names the rule behind each node)")
    for name in ("rtol", "atol", "ntol"):
        _add_tolerance(compare, name, with_default=True)
    _add_tolerance(compare, "cosine", flag="cos-sim")
    compare.set_defaults(command=_compare)


def _add_judge(commands: argparse._SubParsersAction) -> None:
    judge = commands.add_parser("judge", help="judge a saved compare report again with other thresholds")
    judge.add_argument("report", type=Path)
    _add_tolerance(judge, "ntol")
    _add_tolerance(judge, "cosine", flag="cos-sim")
    judge.set_defaults(command=_judge)


def _add_explorer_data(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("explorer-data", help="a compare report's error per original node, as node data "
                               "for Google's Model Explorer (its ONNX adapter)")
    data.add_argument("report", type=Path, help="a compare report.json (results/compare/report.json)")
    data.add_argument("--model", type=Path, help="the original model: key unnamed nodes by the adapter's ids")
    data.add_argument("-o", "--output", type=Path, default=Path("node_data.json"), help="default: node_data.json")
    data.set_defaults(command=_explorer_data)


def _add_tolerance(parser: argparse.ArgumentParser, name: str, flag: str | None = None,
                   with_default: bool = False) -> None:
    """`--flag` for the accuracy key `name`, bounded and described as the config schema says."""
    key = _accuracy_keys()[name]
    parser.add_argument(f"--{flag or name}", type=_tolerance(name), dest=name, help=key["description"],
                        default=key["default"] if with_default else None)


def _add_show(commands: argparse._SubParsersAction) -> None:
    show = commands.add_parser("show", help="list a dump's tensors with shapes and statistics")
    show.add_argument("dump", type=Path)
    show.set_defaults(command=_show)


def _add_rules(commands: argparse._SubParsersAction) -> None:
    rules = commands.add_parser("rules", help="which fusion rules fire on a model")
    rules.add_argument("model", type=Path)
    rules.add_argument("--level", choices=["basic", "extended", "all"], default="all")
    rules.add_argument("--backend", choices=sorted(BACKENDS), default=CPU.name)
    rules.add_argument("--session-config", action="append", default=[], metavar="KEY=VALUE")
    rules.set_defaults(command=_rules)


def _add_reproduce(commands: argparse._SubParsersAction) -> None:
    again = commands.add_parser("reproduce", help="re-run a bundled comparison and check it bit for bit")
    again.add_argument("bundle", type=Path)
    again.add_argument(TRUST_FLAG, action="store_true", dest="trust_code",
                       help="run Python code from the bundle (the val_func module that judged its outputs) with "
                            "your rights; give it only for a bundle whose maker you trust")
    again.set_defaults(command=_reproduce)


def _add_workspace(commands: argparse._SubParsersAction) -> None:
    workspace = commands.add_parser("workspace", help="manage the workspace").add_subparsers(required=True)
    prune = workspace.add_parser("prune", help="list (and with --delete remove) stage folders old or not needed")
    prune.add_argument("--workspace", type=Path,
                       help="the workspace folder (default: the --keep-config's `workspace`, else ./workspace)")
    prune.add_argument("--older-than", type=_number(0, math.inf), metavar="DAYS",
                       help="folders not touched for DAYS")
    prune.add_argument("--keep-config", type=Path, metavar="CONFIG",
                       help="folders the workflow run with --configfile CONFIG does not need; CONFIG's relative "
                            "paths resolve against the current directory, so run this where the workflow runs")
    prune.add_argument("--delete", action="store_true",
                       help="remove what is listed; without it prune only lists (refused while a workflow "
                            "running in the current directory holds the workspace)")
    prune.set_defaults(command=_prune)


def _run(arguments: argparse.Namespace) -> NoReturn:
    """Becomes snakemake (same process, same exit status; Ctrl-C reaches snakemake alone)."""
    request = RunRequest(arguments.target, arguments.model, arguments.samples, arguments.configfile,
                         arguments.profile, arguments.snakemake_args)
    command = snakemake_command(request)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)


def _init(arguments: argparse.Namespace) -> int:
    write_starter_config(PROJECT_CONFIG, load_schema())
    print(f"wrote {PROJECT_CONFIG}: set its model and samples, then `accubisect run fusion_bisect`")
    return 0


def _compare(arguments: argparse.Namespace) -> int:
    accuracy = {"rtol": arguments.rtol, "atol": arguments.atol, "ntol": arguments.ntol, "cosine": arguments.cosine,
                "val_func": None}
    with DumpReader(arguments.reference) as reference, DumpReader(arguments.candidate) as candidate:
        graph = _graph(arguments.graph, candidate) if arguments.graph else graph_from_dump(candidate)
        labels = [str(dump.attrs.get("variant", path.name)) for dump, path in
                  ((reference, arguments.reference), (candidate, arguments.candidate))]
        outputs, sample = candidate.output_names(), str(candidate.attrs.get("sample", "sample"))
    comparison = Compared((arguments.reference,), (arguments.candidate,), ("",), (sample,), tuple(outputs), accuracy,
                          "fp16", tuple(labels))
    report = build_report(comparison, graph, None)
    print(render_summary(report), end="")
    return 0 if report.passed else 1


def _graph(path: Path, candidate: DumpReader) -> GraphRecord:
    """Read here, not as a workspace file: the advice for a damaged stage file (delete its folder) is wrong
    for a file the user names. It must be a graph of the model the candidate was dumped from, or the report
    would name another model's nodes."""
    graph = _named_json(path, "graph", "graph JSON", GraphError, "give the graph.json of the candidate's graph stage")
    record = GraphRecord.from_json(graph, path)
    if record.model_sha256 != candidate.model_sha256:
        raise GraphError(f"{path}: a graph of another model (sha256 {record.model_sha256[:12]}) than "
                         f"{candidate.path} was dumped from ({candidate.model_sha256[:12]}); give the graph.json of "
                         "the candidate's graph stage")
    return record


def _report(path: Path) -> CompareReport:
    """A compare report the user names, read with the advice for a file they gave (not a workspace file's)."""
    report = _named_json(path, "report", "compare report", DumpError, "give the report.json a compare wrote")
    return CompareReport.from_json(report, path)


def _named_json(path: Path, schema: str, what: str, error: type[Exception], advice: str) -> dict[str, Any]:
    """The JSON file the user named, which its schema accepts; `what` and `advice` word the one line that says
    otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as problem:
        raise error(f"{path}: cannot read the {what} ({problem})") from None
    problem = shape_problem(data, schema)
    if problem:
        raise error(f"{path}: not a {what} ({problem}); {advice}")
    return data


def _judge(arguments: argparse.Namespace) -> int:
    measured = _report(arguments.report)
    check = AccuracyCheck.from_config(measured.accuracy)
    check = replace(check, ntol=check.ntol if arguments.ntol is None else arguments.ntol,
                    cosine=check.cosine if arguments.cosine is None else arguments.cosine)
    judged = judge_report(measured, check)
    print(render_summary(judged), end="")
    return 0 if judged.passed else 1


def _explorer_data(arguments: argparse.Namespace) -> int:
    if arguments.output.is_dir():
        raise UsageError(f"-o {arguments.output}: a folder; give the file to write, e.g. -o "
                         f"{arguments.output / 'node_data.json'}")
    if (above := next(folder for folder in arguments.output.parents if folder.exists())).is_file():
        raise UsageError(f"-o {arguments.output}: {above} is a file, not a folder; give a file in a folder")
    report = _report(arguments.report)
    model = _model_of(report, arguments.report, arguments.model) if arguments.model else None
    data = node_data(report, model)
    try:
        write_json(arguments.output, data)
    except OSError as error:
        raise UsageError(f"-o {arguments.output}: cannot write it ({error.strerror}); give a file in a folder you "
                         "can write") from None
    opened = arguments.model or "MODEL.onnx"
    print(f"{len(data['results'])} original nodes' errors written to {arguments.output}; open them over the model "
          f"with:\n  model-explorer {opened} --extensions=model_explorer_onnx --node_data_paths={arguments.output}")
    return 0


def _model_of(report: CompareReport, report_path: Path, path: Path) -> onnx.ModelProto:
    """The model at `path`, refused unless it is the one the report's dumps were made from: node data keyed
    to another model's nodes would load in Model Explorer and show nothing of this one."""
    model = load_model(path, load_weights=False)
    digest = file_sha256(path)
    if digest != report.model_sha256:
        raise ModelError(f"{path}: not the model {report_path} compares (sha256 {digest[:12]}, the report's "
                         f"{report.model_sha256[:12]}); give --model the model the workflow ran on")
    return model


def _reproduce(arguments: argparse.Namespace) -> int:
    outcome = reproduce(arguments.bundle, arguments.trust_code)
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
    config = _keep_config(arguments.keep_config, arguments.workspace) if arguments.keep_config else None
    workspace = Path(config["workspace"]) if config else arguments.workspace or Path("workspace")
    check_workspace(workspace)
    if arguments.delete:
        check_unlocked(workspace, Path.cwd())
    keep = _needed_keys(arguments.keep_config, config) if config else None
    found = removals(workspace, arguments.older_than, keep)
    for removal in found:
        print(f"{'removing' if arguments.delete else 'would remove'} {removal.path} ({_size(removal.bytes)}, "
              f"{removal.why})")
    total = _size(sum(removal.bytes for removal in found))
    if not arguments.delete:
        print(f"{len(found)} item(s), {total} would be freed; nothing was removed (add --delete to remove them)")
        return 0
    remove(found)
    print(f"{len(found)} item(s), {total} freed")
    return 0


def _keep_config(path: Path, workspace: Path | None) -> dict[str, Any]:
    """The config the workflow run with `--configfile path` uses: the Snakefile names no config file of its
    own, so it is this file alone, validated with the defaults filled (`--workspace` acts as
    `--config workspace=DIR`)."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ConfigError(f"--keep-config {path}: not a readable YAML file ({' '.join(str(error).split())})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"--keep-config {path}: holds {type(config).__name__}, not a mapping of config keys")
    if "__use_yte__" in config:  # Snakemake evaluates such a file's Python expressions; prune runs no code
        raise ConfigError(f"--keep-config {path}: a YTE template (__use_yte__), which only Snakemake evaluates; "
                          "pass a plain YAML config")
    try:
        return validate_config({**config, **({"workspace": str(workspace)} if workspace else {})})
    except ConfigError as error:
        raise ConfigError(f"--keep-config {path}: {'; '.join(str(error).splitlines())}") from None


def _needed_keys(path: Path, config: dict[str, Any]) -> set[str]:
    try:
        return needed_keys(Plan.from_config(config))
    except AccubisectError as error:
        raise ConfigError(f"--keep-config {path}: {'; '.join(str(error).splitlines())}") from None


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


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
    entries = dict(_session_entry(item) for item in arguments.session_config)
    check_session_config(entries)
    load_model(arguments.model, load_weights=False)  # a missing or corrupt file fails here in one line
    variant = Variant("fusion_on", arguments.level, entries)
    catalogue, backend = installed_catalogue(), backend_named(arguments.backend)
    backend.require(FUSION_RULES, "accubisect rules")
    backend.check_installed()
    with tempfile.TemporaryDirectory() as folder:
        fired = Compiler(arguments.model, variant, catalogue, backend).compile(Path(folder) / "model.onnx")
    for rule in fired:
        print(f"{rule:<36} {catalogue.section_of(rule)}")
    if not fired:
        print("no fusion rule fires on this model at level", arguments.level)
    return 0


def _session_entry(item: str) -> tuple[str, str]:
    key, equals, value = item.partition("=")
    if not key or not equals:
        raise ConfigError(f"--session-config {item!r}: give KEY=VALUE, e.g. optimization.enable_gelu_approximation=1")
    return key, value


if __name__ == "__main__":
    sys.exit(main())
