"""A disk that refuses writes (`workflow/writable.py`): the folder a run's jobs would write is probed before
the first job, without leaving a file, and a refused write is one line naming the folder. Real refusals:
sysfs refuses every new file, for root too; the whole workflow's read-only and full disks are in
tests/e2e/test_bad_inputs.py (FAILURES)."""

import shutil
from pathlib import Path

import pytest

from accubisect.workflow.writable import WRITABLE, unwritable_line, write_failure

SYSFS = Path("/sys")
needs_sysfs = pytest.mark.skipif(not SYSFS.is_dir(), reason="needs Linux's /sys, a folder no one can add files to")


def test_writable_folders_pass_and_the_probe_leaves_nothing(tmp_path):
    (tmp_path / "results").mkdir()
    outputs = [str(tmp_path / "results" / "compare" / "published.json"), str(tmp_path / "workspace" / "x.json")]
    assert unwritable_line(outputs) is None
    assert [path.name for path in tmp_path.rglob("*")] == ["results"]


@needs_sysfs
def test_a_folder_that_refuses_files_is_named_with_what_to_do(tmp_path):
    assert unwritable_line([str(tmp_path / "a.json"), str(SYSFS / "results" / "compare" / "published.json")]) == (
        f"{SYSFS}: Permission denied; {WRITABLE}")


@needs_sysfs
def test_a_refused_copy_names_the_folder_written_to(tmp_path):
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(OSError) as refused:
        shutil.copyfile(tmp_path / "report.json", SYSFS / "report.json")
    assert write_failure(refused.value, []) == f"{SYSFS}: Permission denied; {WRITABLE}"


def test_any_other_os_error_is_left_to_its_traceback(tmp_path):
    with pytest.raises(OSError) as missing:
        (tmp_path / "no_such.json").read_text()
    assert write_failure(missing.value, [str(tmp_path / "out.json")]) is None
