"""Publishing a target's answer files as one set (formats/published.py), on real files: the folder holds the new
set whole or the old one untouched, never a mix and never a file of the previous run the new one did not write."""

import hashlib
from pathlib import Path

import pytest

from accubisect.core.errors import StepError
from accubisect.formats import published as published_module
from accubisect.formats.published import Published, PublishStep, publish
from accubisect.reports.console import end_of_run


def stage(folder: Path, files: dict[str, str]) -> dict[str, str]:
    """Workspace files with `files`' contents; their paths by name."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return {name.replace(".", "_"): str(folder / name) for name in files}


def contents(folder: Path) -> dict[str, str]:
    return {path.relative_to(folder).as_posix(): path.read_text() for path in folder.rglob("*") if path.is_file()}


def run(named: dict) -> None:
    """A publish job as its rule wires it: each input's copy declared as the output `published_<input>`."""
    folder = Path(named["published"]).parent
    sources = {name: value for name, value in named.items() if name != "published"}
    copies = {f"published_{name}": [str(folder / name / Path(path).name) for path in value] if isinstance(value, list)
              else str(folder / Path(value).name) for name, value in sources.items()}
    publish(PublishStep.from_named({**named, **copies}))


def test_a_publish_replaces_the_folder_with_exactly_its_set(tmp_path):
    """The second run has one sample fewer and no report.html: neither is left from the first."""
    target = tmp_path / "results" / "reduce"
    first = stage(tmp_path / "ws1", {"summary.txt": "run 1", "report.html": "page"})
    run({**first, "inputs": [*stage(tmp_path / "ws1" / "in", {"s0.npz": "a", "s1.npz": "b"}).values()],
         "published": str(target / "published.json")})
    second = stage(tmp_path / "ws2", {"summary.txt": "run 2"})
    run({**second, "inputs": [*stage(tmp_path / "ws2" / "in", {"s0.npz": "c"}).values()],
         "published": str(target / "published.json")})
    files = contents(target)
    assert files.keys() == {"summary.txt", "inputs/s0.npz", "published.json"}
    assert (files["summary.txt"], files["inputs/s0.npz"]) == ("run 2", "c")
    record = Published.read(target / "published.json")
    assert list(record.files) == ["summary.txt", "inputs/s0.npz"]
    for name, entry in record.files.items():
        data = (target / name).read_bytes()
        assert (entry.sha256, entry.bytes) == (hashlib.sha256(data).hexdigest(), len(data))
    assert sorted(path.name for path in target.parent.iterdir()) == ["reduce"]  # no staging left


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two_renames"])
def test_a_publish_that_fails_leaves_the_old_set_untouched(tmp_path, monkeypatch, exchange):
    """A source gone before the copy (as a full disk or a crash mid-copy would end it), with and without the
    filesystem's atomic exchange (NFS has none)."""
    if not exchange:
        monkeypatch.setattr(published_module, "_exchange", lambda first, second: False)
    target = tmp_path / "results" / "fusion_bisect"
    run({**stage(tmp_path / "ws1", {"result.json": "1", "summary.txt": "1"}),
         "published": str(target / "published.json")})
    before = contents(target)
    broken = stage(tmp_path / "ws2", {"result.json": "2", "summary.txt": "2"})
    Path(broken["summary_txt"]).unlink()
    with pytest.raises(FileNotFoundError):
        run({**broken, "published": str(target / "published.json")})
    assert contents(target) == before
    run({**stage(tmp_path / "ws3", {"result.json": "3"}), "published": str(target / "published.json")})
    assert contents(target).keys() == {"result.json", "published.json"}
    assert sorted(path.name for path in target.parent.iterdir()) == ["fusion_bisect"]


def test_what_a_killed_publish_left_beside_the_folder_goes_with_the_next(tmp_path):
    target = tmp_path / "results" / "compare"
    for leftover in (".compare.new", ".compare.old"):
        (tmp_path / "results" / leftover).mkdir(parents=True)
        (tmp_path / "results" / leftover / "report.json").write_text("torn")
    run({**stage(tmp_path / "ws", {"report.json": "{}"}), "published": str(target / "published.json")})
    assert sorted(path.name for path in target.parent.iterdir()) == ["compare"]


def test_each_published_file_is_declared_as_its_rule_s_output(tmp_path):
    files = stage(tmp_path / "ws", {"result.json": "r"})
    inputs = [str(path) for path in stage(tmp_path / "ws" / "in", {"s0.npz": "x"}).values()]
    folder = tmp_path / "results" / "t"
    step = PublishStep.from_named({**files, "inputs": inputs, "published": str(folder / "published.json"),
                                   "published_result_json": str(folder / "result.json"),
                                   "published_inputs": [str(folder / "inputs" / "s0.npz")]})
    assert step.files == (("result.json", Path(files["result_json"])), ("inputs/s0.npz", Path(inputs[0])))
    with pytest.raises(StepError, match=r"outputs \['published_result_json'\]"):
        PublishStep.from_named({**files, "published": str(folder / "published.json"),
                                "published_result_json": str(folder / "other.json")})
    with pytest.raises(StepError, match=r"outputs \['published_result_json'\]"):
        PublishStep.from_named({**files, "published": str(folder / "published.json")})
    with pytest.raises(StepError, match="two inputs share a name"):
        PublishStep.from_named({**files, "again": files["result_json"], "published": str(folder / "published.json"),
                                "published_result_json": str(folder / "result.json"),
                                "published_again": str(folder / "result.json")})


def test_the_end_of_run_lists_no_manifest_among_the_answer_files(tmp_path):
    results = tmp_path / "results"
    context = "model m.onnx; 1 sample(s)"
    target = results / "precision_bisect"
    run({**stage(tmp_path / "ws", {"keep_dtype.txt": "k", "summary.txt": f"{context}\nkeep 1 node\n"}),
         "published": str(target / "published.json")})
    outputs = [str(target / name) for name in ("published.json", "keep_dtype.txt", "summary.txt")]
    assert end_of_run(results, context, outputs) == (f"{target}/summary.txt:\n{context}\nkeep 1 node\nanswer files:\n"
                                                     f"  {target}/keep_dtype.txt\n")
