"""Golden files for the bundled example's answer files (`./run example`, i.e. `snakemake fusion_bisect
--configfile examples/config.yaml`): the comparison's report.json, report.csv and summary.txt, the fusion-on
graph.json, and fusion_bisect's result.json, summary.txt and fusion_switch.cfg, stored under tests/golden/.

The example is run once per module, in a private copy of the workflow. Each file is compared with its golden
copy after `normalised` (below) takes out what legitimately varies; everything else must be the same: keys
and their order, columns, rows, rule and tensor names and order, culprits, text and formats. Numbers made by
computation are compared by `same_number`.

After an intended change, regenerate the golden files with one command and review the diff before committing:

    ACCUBISECT_REGOLD=1 .venv/bin/pytest -n 0 tests/e2e/test_golden.py
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLE, copy_workflow, snakemake

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
REGOLD = os.environ.get("ACCUBISECT_REGOLD") == "1"
REGOLD_COMMAND = "ACCUBISECT_REGOLD=1 .venv/bin/pytest -n 0 tests/e2e/test_golden.py"

# golden file name: the file of the example's run it pins (graph.json: found by its variant, see `produced`)
OUTPUTS = {
    "compare_report.json": "results/compare/report.json",
    "compare_report.csv": "results/compare/report.csv",
    "compare_summary.txt": "results/compare/summary.txt",
    "graph.json": None,
    "fusion_bisect_result.json": "results/fusion_bisect/result.json",
    "fusion_bisect_summary.txt": "results/fusion_bisect/summary.txt",
    "fusion_switch.cfg": "results/fusion_bisect/fusion_switch.cfg",
}

DURATION_KEYS = frozenset({"seconds"})  # a probe's wall time
REL_TOL = 1e-3  # BLAS/kernels may differ in the last digits of a metric computed from float32 tensors
ABS_TOL = 1e-6  # values at float32 rounding-noise level (a 1e-7 error of an exact op) are not pinned
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w])")


@pytest.fixture(scope="module")
def example_run(tmp_path_factory) -> Path:
    folder = copy_workflow(tmp_path_factory.mktemp("golden"))
    snakemake(folder, "fusion_bisect", *EXAMPLE)
    return folder


def produced(folder: Path, name: str) -> str:
    """The text of the run's file that golden file `name` pins."""
    if OUTPUTS[name] is not None:
        return (folder / OUTPUTS[name]).read_text()
    graphs = [path for path in sorted((folder / "workspace").rglob("graph.json"))
              if json.loads(path.read_text())["variant"] == "fusion_on"]
    assert len(graphs) == 1, f"expected one fusion_on graph.json in the workspace, found {graphs}"
    return graphs[0].read_text()


def normalised(text: str, name: str, folder: Path) -> str:
    """What legitimately varies between two runs of the same example, taken out of a file's text:
    - the run's folder (a fresh temporary one each time) becomes `<run>` wherever a path names it;
    - durations (DURATION_KEYS in JSON: a probe's `seconds`) are dropped;
    - JSON is re-indented one key a line, in its own key order, so that a diff of the golden files reads.
    Timestamps, host names and library versions appear in none of these files today; should one appear, it
    is added here, with its reason. Numbers are left as they are: `same_number` compares them."""
    text = text.replace(str(folder.resolve()), "<run>").replace(str(folder), "<run>")
    if not name.endswith(".json"):
        return text
    return json.dumps(_without_durations(json.loads(text)), indent=1) + "\n"


def _without_durations(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_durations(item) for key, item in value.items() if key not in DURATION_KEYS}
    if isinstance(value, list):
        return [_without_durations(item) for item in value]
    return value


def same_number(got: float, want: float, want_text: str | None = None) -> bool:
    """Equal within REL_TOL/ABS_TOL or, for a number printed as `want_text`, within one unit of its last
    printed digit ("4.77e-07" may be "4.78e-07", "0.28" may be "0.29"). NaN equals NaN; an infinity equals
    only itself."""
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    if math.isinf(want) or math.isinf(got):
        return got == want
    slack = max(ABS_TOL, REL_TOL * abs(want), last_digit(want_text) if want_text else 0.0)
    return abs(got - want) <= slack * (1 + 1e-9)


def last_digit(text: str) -> float:
    """The value of one unit in the last digit of a printed decimal; 0 for an integer."""
    mantissa, _, exponent = text.lower().partition("e")
    if "." not in mantissa and not exponent:
        return 0.0
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where two JSON values differ: a key, its order, a type or length, a string, or a number beyond
    `same_number`. Integers and booleans are compared exactly."""
    if type(got) is not type(want):
        return [f"{where or '/'}: {type(got).__name__} {got!r:.80}, golden {type(want).__name__} {want!r:.80}"]
    if isinstance(want, dict):
        if list(got) != list(want):
            return [f"{where or '/'}: keys {list(got)}, golden {list(want)}"]
        return [line for key in want for line in differences(got[key], want[key], f"{where}/{key}")]
    if isinstance(want, list):
        if len(got) != len(want):
            return [f"{where or '/'}: {len(got)} items, golden {len(want)}: {got!r:.200} vs {want!r:.200}"]
        return [line for index, (a, b) in enumerate(zip(got, want)) for line in differences(a, b, f"{where}[{index}]")]
    if isinstance(want, float):
        return [] if same_number(got, want) else [f"{where}: {got!r}, golden {want!r}"]
    return [] if got == want else [f"{where}: {got!r:.200}, golden {want!r:.200}"]


def text_differences(got: str, want: str) -> list[str]:
    """Line by line: the text around the numbers and each number's form (integer, decimal, exponent) equal;
    integers equal, other numbers `same_number` to their golden ones."""
    got_lines, want_lines = got.splitlines(), want.splitlines()
    if len(got_lines) != len(want_lines):
        return [f"{len(got_lines)} lines, golden {len(want_lines)}"]
    found = []
    for number, (line, golden) in enumerate(zip(got_lines, want_lines), 1):
        if NUMBER.sub(_form, line) != NUMBER.sub(_form, golden):
            found.append(f"line {number}: {line!r}\n   golden: {golden!r}")
            continue
        for a, b in zip(NUMBER.findall(line), NUMBER.findall(golden)):
            if not (a == b if _form(b) == "<int>" else same_number(float(a), float(b), b)):
                found.append(f"line {number}: {a}, golden {b}: {line!r}")
    return found


def _form(number: re.Match | str) -> str:
    text = number if isinstance(number, str) else number.group()
    return "<exp>" if "e" in text.lower() else "<dec>" if "." in text else "<int>"


def csv_differences(got: str, want: str) -> list[str]:
    """Cell by cell: the header and every non-numeric cell equal, numeric cells `same_number`."""
    got_rows, want_rows = list(csv.reader(io.StringIO(got))), list(csv.reader(io.StringIO(want)))
    if len(got_rows) != len(want_rows) or got_rows[:1] != want_rows[:1]:
        return [f"{len(got_rows)} rows with header {got_rows[:1]}, golden {len(want_rows)} with {want_rows[:1]}"]
    header, found = want_rows[0], []
    for number, (row, golden) in enumerate(zip(got_rows[1:], want_rows[1:]), 2):
        if len(row) != len(golden):
            found.append(f"row {number}: {len(row)} cells, golden {len(golden)}")
            continue
        for column, a, b in zip(header, row, golden):
            numbers = _number(a), _number(b)
            same = a == b if None in numbers else same_number(*numbers, b)
            if not same:
                found.append(f"row {number} ({row[1]}, {row[6]}), {column}: {a!r}, golden {b!r}")
    return found


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(OUTPUTS))
def test_the_examples_answer_files_match_their_golden_copies(example_run, name):
    text = normalised(produced(example_run, name), name, example_run)
    golden = GOLDEN / name
    if REGOLD:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} is missing: create it with `{REGOLD_COMMAND}` and review it"
    want = golden.read_text()
    if name.endswith(".json"):
        found = differences(json.loads(text), json.loads(want))
    elif name.endswith(".csv"):
        found = csv_differences(text, want)
    elif name.endswith(".txt"):
        found = text_differences(text, want)
    else:  # fusion_switch.cfg: the deployable file, byte for byte
        found = [] if text == want else [f"{text!r}, golden {want!r}"]
    assert not found, (f"{name} differs from {golden} (if the change is intended: `{REGOLD_COMMAND}`, then "
                       "review the diff):\n" + "\n".join(found[:20]))


@pytest.mark.parametrize(("got", "want", "same"), [
    (0.2805, 0.28, False), ("0.29", "0.28", True), ("0.30", "0.28", False),  # one unit of the last digit
    ("4.78e-07", "4.77e-07", True), ("4.79e-07", "4.77e-07", True),  # both at the noise floor (ABS_TOL)
    ("0.000475", "0.000474", True), ("0.000480", "0.000474", False), ("17.49", "17.48", True),
    ("17.5", "17.48", False), ("5", "4", False), ("inf", "inf", True), ("1e300", "inf", False),
    ("nan", "nan", True), ("0", "nan", False), (1.0001, 1.0, True), (1.01, 1.0, False),
])
def test_numbers_are_compared_to_their_printed_precision(got, want, same):
    """The comparison itself (fast tier), so that it cannot silently pass a changed value."""
    text = want if isinstance(want, str) else None
    assert same_number(float(got), float(want), text) is same


@pytest.mark.parametrize(("got", "want", "same"), [
    ("worst: max abs 0.000475, max rel 1, mismatch 17.49%",
     "worst: max abs 0.000474, max rel 1, mismatch 17.48%", True),
    ("worst: max abs 0.000475, max rel 2, mismatch 17.48%",
     "worst: max abs 0.000474, max rel 1, mismatch 17.48%", False),
    ("worst: max abs 4.75e-04, max rel 1, mismatch 17.48%",
     "worst: max abs 0.000474, max rel 1, mismatch 17.48%", False),
    ("FAIL on 4 of 4 (sample0, sample1)", "FAIL on 4 of 4 (sample0, sample2)", False),
    ("rule GeluFusion", "rule GeluApproximation", False),
])
def test_text_is_compared_around_its_numbers(got, want, same):
    assert (not text_differences(got, want)) is same
