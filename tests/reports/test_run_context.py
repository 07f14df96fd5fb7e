"""What a run was made from: the summaries' first line, the pages' header and the command applying an answer."""

import shlex

import yaml

from accubisect.formats.config import validate_config
from accubisect.reports.run_context import (
    PageHeader,
    apply_command,
    compare_context,
    context_line,
    invocation,
    line_of,
    run_context,
)

CONFIG = validate_config({"model": "m.onnx", "samples": "data"})


def test_context_line_names_every_setting_in_force():
    line = context_line(model="m.onnx", samples="data", sample_count=3, level="extended",
                        session_config={"b.key": 2, "a.key": "1"}, fusion_switch="off.cfg", backend="ort-cuda")
    assert line == ("model m.onnx; 3 sample(s) from data; compile level extended; session config a.key=1, b.key=2; "
                    "switch file off.cfg; backend ort-cuda")
    assert "\n" not in line


def test_a_config_with_model_and_samples_only_runs_on_the_schema_defaults():
    context = run_context(CONFIG, 4, "ab" * 32)
    assert line_of(context) == ("model m.onnx; 4 sample(s) from data; compile level all; session config none; "
                                "switch file none; backend ort-cpu")
    assert context["model_sha256"] == "ab" * 32 and context["config"] == CONFIG


def test_a_compare_job_is_given_only_the_sections_that_decide_its_comparison():
    """A setting that cannot change a comparison (bisect budgets, the folders) is no param of its job, so
    changing it reruns no comparison."""
    context = run_context(CONFIG, 4, "ab" * 32, invocation(["my.yaml"], {}))
    fusion, precision = compare_context(context, "fusion"), compare_context(context, "precision")
    assert set(fusion["config"]) == {"model", "samples", "backend", "compile", "dump", "accuracy", "compare"}
    assert set(precision["config"]) == set(fusion["config"]) - {"compare"} | {"precision"}
    assert fusion["invocation"] is None and fusion["comparison"] == "fusion"
    assert line_of(fusion) == line_of(context)


def snakemake_reads(word):
    """A `key=value` word of --config as Snakemake parses its value: YAML with the BaseLoader (cli.parse_config)."""
    return yaml.load(word.partition("=")[2], Loader=yaml.BaseLoader)


def test_the_apply_command_is_the_run_s_own_invocation_plus_the_answer():
    """As given on the command line, --config values come back as Snakemake parsed them (nested scalars are
    strings): the command says them as the user did, and Snakemake reads back exactly what it was given."""
    overrides = {"results": "out", "compile": {"level": "extended"}, "accuracy": {"rtol": "0.01", "cosine": "0.999"}}
    context = run_context(CONFIG, 4, None, invocation(["examples/config.yaml"], overrides))
    command = apply_command("compare", context, {"compile": {"fusion_switch": "out/fusion_bisect/fusion_switch.cfg"}})
    assert command == ("snakemake compare --cores 2 --configfile examples/config.yaml --config results=out "
                       "compile='{level: extended, fusion_switch: out/fusion_bisect/fusion_switch.cfg}' "
                       "accuracy='{rtol: 0.01, cosine: 0.999}'")
    words = shlex.split(command)  # as the shell hands it to snakemake
    assert snakemake_reads(words[-2]) == {"level": "extended", "fusion_switch": "out/fusion_bisect/fusion_switch.cfg"}
    assert snakemake_reads(words[-1]) == overrides["accuracy"]
    names = ["onnx::Shape_422", "a b", "it's", "-x", "[0]", "/model/Mul_1"]
    odd = apply_command("precision", run_context(CONFIG, 1), {"precision": {"keep_dtype": names}})
    assert odd.startswith("snakemake precision --cores 2 --configfile '<your config>' --config precision=")
    assert snakemake_reads(shlex.split(odd)[-1]) == {"keep_dtype": names}


def test_a_page_header_names_versions_and_the_date():
    header = PageHeader.now(run_context(CONFIG, 1, "cd" * 32), {"rtol": 0.1}, [("compare report", "../compare/")])
    assert set(header.versions) == {"accubisect", "onnxruntime", "onnx", "numpy", "python"}
    assert "not installed" not in header.versions.values()
    assert header.written.endswith(" UTC") and header.model == "m.onnx" and header.config == CONFIG
