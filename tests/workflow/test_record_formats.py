"""Every versioned record in formats/ found by walking the package, none named here: the format number it
reads is one its module declares, and a file of another format, or of its format without its fields, is
refused in one line naming the file and the folder to delete. A record added to formats/ is checked without
editing this test."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re

import pytest

import accubisect.formats
from accubisect.core.errors import WorkspaceError

# versioned records whose file another program reads, with its own check of the format
READ_ELSEWHERE = {"CandidateSpec": "repro.py refuses a candidate.json of another format",
                  "BundleManifest": "reproduce checks a bundle's manifest against its JSON schema",
                  "BisectResult": "the base of result.json: FusionResult and PrecisionResult read their kind's"}


def _modules():
    return [importlib.import_module(f"accubisect.formats.{info.name}")
            for info in pkgutil.iter_modules(accubisect.formats.__path__)]


def _formats(module) -> set[int]:
    return {value for name, value in vars(module).items() if name.endswith("_FORMAT") and isinstance(value, int)}


def _records() -> list[type]:
    """Classes of formats/ that read a file of their own (`read` a classmethod) and write JSON (`to_json`)."""
    return [cls for module in _modules() for cls in vars(module).values()
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and hasattr(cls, "to_json")
            and isinstance(inspect.getattr_static(cls, "read", None), classmethod)]


def _versioned_writers() -> list[str]:
    """Classes of formats/ that write JSON in a module declaring a format, by name."""
    return [cls.__name__ for module in _modules() if _formats(module) for cls in vars(module).values()
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and hasattr(cls, "to_json")
            and "format" in inspect.getsource(cls.to_json)]


def test_the_walk_finds_the_records():
    names = {cls.__name__ for cls in _records()}
    assert {"CompileRecord", "GraphRecord", "FinalizeRecord", "OpenVinoDeploy", "OpenVinoPrecisionResult"} <= names


def test_every_record_that_writes_a_format_reads_it_back_or_says_who_does():
    readers = {cls.__name__ for cls in _records()}
    assert {name for name in _versioned_writers() if name not in readers} == set(READ_ELSEWHERE)


@pytest.mark.parametrize("record", _records(), ids=lambda cls: cls.__name__)
def test_a_record_refuses_another_format_and_reads_its_own(tmp_path, record):
    folder = tmp_path / "workspace" / "stage" / "key"
    folder.mkdir(parents=True)
    path = folder / "record.json"
    path.write_text(json.dumps({"format": 999}))
    with pytest.raises(WorkspaceError) as refused:
        record.read(path)
    message = str(refused.value)
    found = re.fullmatch(rf"{re.escape(str(path))}: not a .+ of this accubisect version \(format 999, this version "
                         rf"reads format (\d+)\); delete {re.escape(str(folder))} and rerun to rebuild it", message)
    assert found, message
    version = int(found[1])
    assert version in _formats(inspect.getmodule(record))

    path.write_text(json.dumps({"format": version}))  # its own format, every field missing
    with pytest.raises(WorkspaceError) as incomplete:
        record.read(path)
    assert "\n" not in str(incomplete.value) and str(incomplete.value).startswith(f"{path}: ")
    assert "no field" in str(incomplete.value) and str(folder) in str(incomplete.value)
