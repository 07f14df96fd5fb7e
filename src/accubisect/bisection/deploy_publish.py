"""Publishing the deployable answer (job `precision_deploy`, `bisection/deployable.py`): model.onnx with the
settled answer's nodes kept in fp32 and its own data file beside it, checked by `onnx.checker` and run by ONNX
Runtime on every sample as written, and finalize.json.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import onnx

from accubisect.bisection.deploy_probes import Deployable, failure_line, runs_on
from accubisect.bisection.judging import SampleJudge
from accubisect.bisection.precision_bisect import worst_text
from accubisect.core.errors import FinalizeError, ModelError
from accubisect.formats.assignment import Assignment
from accubisect.formats.files import atomic_model
from accubisect.formats.finalize_record import FinalizeRecord
from accubisect.formats.linked_weights import save_gathered
from accubisect.runtime import ort_compile
from accubisect.runtime.backends import Backend


class PublishPaths(Protocol):
    """Where the job's step puts the user's model and the published files (`DeployStep`)."""

    model: Path
    finalized_model: Path
    finalized_data: Path
    finalize_json: Path


def publish_model(step: PublishPaths, deployable: Deployable, keep: Sequence[str],
                  assignment: Assignment) -> FinalizeRecord:
    """model.onnx with `keep` in fp32 and its weights in its own data file beside it (model.onnx.data: it loads
    wherever the two are copied, at any size), checked and run on every sample as written, and finalize.json,
    which is returned. The two files appear together or not at all (`atomic_model`)."""
    final = deployable.converted(frozenset(keep))
    with atomic_model(step.finalized_model) as temporary:
        save_gathered(final, temporary, deployable.folder, step.finalized_data.name)
        _check(final, temporary, step.model)
        model = FinalizeRecord(step.model.name, assignment.dtype, assignment.graph,
                               len(set(deployable.candidates) - set(keep)), len(deployable.model.graph.node),
                               *verify(final, temporary, assignment.dtype, deployable.judge, deployable.runtime,
                                       deployable.options))
        if model.passed is False:
            raise FinalizeError(f"{step.model}: the mixed-precision model fails the accuracy check when ONNX Runtime "
                                f"runs it on every sample ({worst_text(model.worst or {})}), though it passed as a "
                                "probe; nothing is published: keep more nodes in fp32 (precision.keep_dtype) and "
                                "rerun, or report it")
    model.write(step.finalize_json)
    return model


def _check(final: onnx.ModelProto, saved: Path, original: Path) -> None:
    """`onnx.checker` on `final` as saved (with its data file), with full type and shape inference where the
    user's model at `original` itself passes it (exporters write models that do not)."""
    try:
        onnx.checker.check_model(str(saved), full_check=_passes_full_check(original))
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        what = f"{original}: the mixed-precision model fails onnx.checker"
        raise FinalizeError(failure_line(what, error, final)) from None


def _passes_full_check(model: Path) -> bool:
    try:
        onnx.checker.check_model(str(model), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return False
    return True


def verify(final: onnx.ModelProto, saved: Path, dtype: str, judge: SampleJudge, backend: Backend,
           options: ort_compile.CompileOptions) -> tuple[str, bool | None, Mapping[str, float] | None]:
    """How `final` was checked, its verdict and worst output metrics: as saved at `saved`, loaded from there and
    run by ORT compiled with `options` (the variant precision was assigned on) and judged by `judge` on every
    sample; where ORT cannot run it (`runs_on`) it is only checked, with no verdict."""
    if not runs_on(dtype, backend):
        return "onnx.checker only: ONNX Runtime's CPU provider has no bf16 kernels", None, None
    try:
        runner = ort_compile.Runner(saved, options, backend).activate()
        judged = judge.judge(runner, stop_early=False)
    except ModelError as error:  # ORT refused to load or to run it
        raise FinalizeError(failure_line("the mixed-precision model fails in ONNX Runtime", error, final)) from None
    return (f"loaded and run by ONNX Runtime on {backend.provider} at level {options.level}", judged["passed"],
            judged["worst"])
