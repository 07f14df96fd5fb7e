"""`snakemake reduce` with the real snakemake: on the bundled examples (fusion and precision) and on two
corpus models (minilm's approximate GELU, a fusion failure; yolov8n in fp16, a precision failure), the repro
in results/reduce fails as written and passes with the bisection's answer, run as a user runs it."""

import json
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from conftest import copy_workflow, snakemake
from corpus import CORPUS

pytestmark = pytest.mark.e2e

STANDALONE = ("import runpy, sys; sys.modules['accubisect'] = None; sys.argv = ['repro.py', *sys.argv[1:]]; "
              "runpy.run_path('repro.py', run_name='__main__')")  # the fusion repro runs without accubisect


def repro(folder, *arguments, standalone=False):
    command = [sys.executable, "-c", STANDALONE] if standalone else [sys.executable, "repro.py"]
    return subprocess.run([*command, *arguments], cwd=folder / "results/reduce", capture_output=True, text=True,
                          check=False)


def reduced(folder, config, kind):
    """`snakemake reduce`, its record, and the repro checked both ways; the seconds it took."""
    start = time.monotonic()
    snakemake(folder, "reduce", "--configfile", config)
    seconds = time.monotonic() - start
    record = json.loads((folder / "results/reduce/reduce.json").read_text())
    as_written = repro(folder, standalone=kind == "fusion")
    assert as_written.returncode == 1, as_written.stdout + as_written.stderr
    assert "FAILS" in as_written.stdout and "the bug is there" in as_written.stdout
    flag, answer = (("--fusion-switch", "../fusion_bisect/fusion_switch.cfg") if kind == "fusion" else
                    ("--keep-dtype", "../precision_bisect/keep_dtype.txt"))
    fixed = repro(folder, flag, answer, standalone=kind == "fusion")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert record["repro_nodes"] < record["model_nodes"]
    print(f"{kind}: {record['repro_nodes']} of {record['model_nodes']} nodes, {len(record['steps'])} steps, "
          f"{seconds:.0f} s")
    return record


def test_bundled_example_reduces_to_the_gelu_and_reruns_from_its_verdicts(tmp_path):
    folder = copy_workflow(tmp_path)
    record = reduced(folder, "examples/config.yaml", "fusion")
    assert record["repro_nodes"] == 5 and all(name.startswith("gelu/") for name in record["nodes"])
    inputs = np.load(folder / "results/reduce/inputs/sample0.npz")
    assert set(inputs.files) == set(record["inputs"])  # fed from the reference dump at the boundary
    assert len(list((folder / "results/reduce/expected").iterdir())) == 4  # every sample
    assert set(record["from_dump"]) >= set(record["inputs"]) and record["computed"] == []
    wrong = repro(folder, "--keep-dtype", "keep_dtype.txt")
    assert wrong.returncode == 2 and "does not apply" in wrong.stderr
    for path in (folder / "workspace/reduce", folder / "results/reduce"):  # the job again: verdicts from disk
        shutil.rmtree(path)
    run = snakemake(folder, "reduce", "--configfile", "examples/config.yaml")
    again = json.loads((folder / "results/reduce/reduce.json").read_text())
    assert again["nodes"] == record["nodes"] and all(step["from_disk"] for step in again["steps"])
    console = run.stderr + run.stdout
    assert all(re.search(rf"reduce {side}: (\d+) probe\(s\), \1 of them from disk", console)
               for side in ("outputs", "inputs")) and "probe(s) running" not in console


def test_nothing_to_reduce_is_one_line(tmp_path):
    folder = copy_workflow(tmp_path)
    config = yaml.safe_load((folder / "examples/config.yaml").read_text())
    config["compile"]["session_config"] = {}  # no approximate GELU: fusion-on passes
    (folder / "passing.yaml").write_text(yaml.safe_dump(config))
    run = snakemake(folder, "reduce", "--configfile", "passing.yaml", check=False)
    assert run.returncode != 0
    assert "the candidate passes the accuracy check (rtol 0.001" in run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr


def test_precision_example_reduces_to_the_batchnorm_from_statistics_only_dumps(tmp_path):
    """Dumps of statistics only hold no tensor whole: every reference tensor the repro needs is computed by
    running the model (fusion off, fp32) with it exposed."""
    folder = copy_workflow(tmp_path)
    config = yaml.safe_load((folder / "examples/precision/config.yaml").read_text())
    (folder / "reduce.yaml").write_text(yaml.safe_dump({**config, "results": "results",
                                                        "dump": {"statistics_only": True},
                                                        "reduce": {"bisection": "precision"}}))
    record = reduced(folder, "reduce.yaml", "precision")
    assert record["nodes"] == ["bn"]
    assert record["from_dump"] == [] and set(record["computed"]) >= {*record["inputs"], *record["outputs"]}
    candidate = json.loads((folder / "results/reduce/candidate.json").read_text())
    assert candidate["kind"] == "precision" and candidate["low"] == ["bn"] and candidate["dtype"] == "fp16"


@pytest.mark.integration
@pytest.mark.parametrize(("name", "kind"), [("minilm", "fusion"), ("yolov8n", "precision")])
def test_corpus_models_reduce_to_a_few_nodes(name, kind, tmp_path):
    model = CORPUS[name]
    folder = copy_workflow(tmp_path)
    model.write_samples(folder / "samples")
    settings = model.fusion_config if kind == "fusion" else model.precision_config
    config = {"model": str(model.model_path()), "samples": "samples", **settings, "reduce": {"bisection": kind}}
    (folder / "reduce.yaml").write_text(yaml.safe_dump(config))
    record = reduced(folder, "reduce.yaml", kind)
    assert record["repro_nodes"] <= 10
