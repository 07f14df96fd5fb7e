"""Sample files: `sample{N}_inputs.npz` with optional `sample{N}_outputs.npz` golden outputs.

Keys are the model's input and output names. Files are read with `allow_pickle=False`, and their
headers are checked against the model before anything runs, so a wrong dtype or rank fails in one line
instead of deep inside ONNX Runtime.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accubisect.core.errors import SampleError
from accubisect.formats.model import TensorSpec

INPUTS_PATTERN = re.compile(r"^sample(\d+)_inputs\.npz$")


@dataclass(frozen=True)
class Sample:
    index: int
    inputs: Path
    outputs: Path | None  # golden outputs, if the user has them

    @property
    def name(self) -> str:
        return f"sample{self.index}"


def discover_samples(folder: Path) -> list[Sample]:
    folder = Path(folder)
    if not folder.is_dir():
        raise SampleError(f"{folder}: samples folder not found; set `samples` to a folder of sample{{N}}_inputs.npz")
    samples = []
    for path in folder.iterdir():
        match = INPUTS_PATTERN.match(path.name)
        if match:
            index = int(match.group(1))
            golden = folder / f"sample{index}_outputs.npz"
            samples.append(Sample(index, path, golden if golden.exists() else None))
    if not samples:
        raise SampleError(f"{folder}: no sample{{N}}_inputs.npz files; save inputs with numpy.savez(..., **feeds)")
    return sorted(samples, key=lambda sample: sample.index)


def select_samples(samples: list[Sample], steps: str | None) -> list[Sample]:
    """The samples named by a seeds'-style selection such as "0|3-5|10" (None selects all)."""
    if steps is None:
        return samples
    wanted: set[int] = set()
    for part in steps.split("|"):
        first, _, last = part.partition("-")
        wanted |= set(range(int(first), int(last or first) + 1))
    chosen = [sample for sample in samples if sample.index in wanted]
    if not chosen:
        available = [sample.index for sample in samples]
        raise SampleError(f"dump.samples: '{steps}' selects none of the samples {available}")
    return chosen


def npz_signature(path: Path) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Dtype and shape of every array in an npz file, read from the headers only."""
    try:
        with zipfile.ZipFile(path) as archive:
            return {_key(member): _header(archive, member) for member in archive.namelist()}
    except (OSError, zipfile.BadZipFile, ValueError) as error:
        raise SampleError(f"{path}: not a readable .npz file ({error}); write it with numpy.savez") from None


def _key(member: str) -> str:
    return member.removesuffix(".npy")


def _header(archive: zipfile.ZipFile, member: str) -> tuple[np.dtype, tuple[int, ...]]:
    with archive.open(member) as stream:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            array = np.load(archive.open(member), allow_pickle=False)
            shape, dtype = array.shape, array.dtype
    return np.dtype(dtype), tuple(shape)


def check_arrays(path: Path, specs: list[TensorSpec], role: str) -> None:
    """Fails unless the npz at `path` holds exactly `specs`, each with the right dtype and the rank and static
    sizes the model declares."""
    for spec, _, problem in _mismatches(path, specs, role):
        raise SampleError(f"{path}: {role} '{spec.name}' {problem}")


def shape_hints(path: Path, specs: list[TensorSpec]) -> list[str]:
    """Golden outputs at `path` checked as far as a declaration can tell: exactly the model's outputs, each of
    its dtype (else a SampleError). A shape other than the declared one is returned, one line per output, not
    refused: exporters declare output shapes wrong (a PyTorch 1.9 CTC head declares [1, seqlen] and makes
    [22, 1, 8210]) and ONNX Runtime runs such a model, so the comparison checks golden outputs against what
    the model really produces instead (`check_golden_shapes`)."""
    hints = []
    for spec, dtype, problem in _mismatches(path, specs, "output"):
        if dtype != spec.dtype:
            raise SampleError(f"{path}: output '{spec.name}' {problem}")
        hints.append(f"{path}: output '{spec.name}' {problem}")
    return hints


def _mismatches(path: Path, specs: list[TensorSpec], role: str) -> list[tuple[TensorSpec, np.dtype, str]]:
    """(spec, the array's dtype, what is wrong) per array of the npz at `path` that departs from its spec; a
    missing or unexpected key raises a SampleError."""
    found = npz_signature(path)
    expected = {spec.name: spec for spec in specs}
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing or extra:
        raise SampleError(
            f"{path}: keys must be the model's {role} names {sorted(expected)}; "
            f"missing {missing}, unexpected {extra}"
        )
    problems = [(expected[name], dtype, expected[name].mismatch(dtype, shape))
                for name, (dtype, shape) in found.items()]
    return [(spec, dtype, problem) for spec, dtype, problem in problems if problem]


def check_samples(samples: list[Sample], inputs: list[TensorSpec], outputs: list[TensorSpec]) -> str:
    """Fails on inputs that do not fit the model's declarations, and on golden outputs of other names or
    dtypes; returns a warning (one line), or "", for golden outputs shaped otherwise than the model declares."""
    hints = []
    for sample in samples:
        check_arrays(sample.inputs, inputs, "input")
        if sample.outputs is not None:
            hints += shape_hints(sample.outputs, outputs)
    if not hints:
        return ""
    more = f" (and {len(hints) - 1} more like it)" if len(hints) > 1 else ""
    return (f"{hints[0]}{more}; declared output shapes are only hints: the golden outputs are checked against "
            "the outputs the model really produces when they are compared")


def check_distinct(samples: list[Sample], digest: Callable[[Path], str]) -> None:
    """Two samples with the same input bytes would share one dump, so one of them is refused."""
    seen: dict[str, Path] = {}
    for sample in samples:
        first = seen.setdefault(digest(sample.inputs), sample.inputs)
        if first != sample.inputs:
            raise SampleError(f"{first} and {sample.inputs} hold identical inputs; remove one")


def check_golden_shapes(path: Path, golden: Mapping[str, np.ndarray], produced: Mapping[str, np.ndarray]) -> None:
    """Golden outputs shaped as the model's outputs really are: the model may leave their sizes symbolic,
    so only a run can tell, and a wrong-shape golden file is the user's to fix, not a failing verdict."""
    for name, array in golden.items():
        if array.shape != produced[name].shape:
            raise SampleError(f"{path}: golden output '{name}' has shape {list(array.shape)}, the model produces "
                              f"{list(produced[name].shape)}; regenerate the golden outputs")


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as error:
        raise SampleError(f"{path}: cannot load ({error}); write it with numpy.savez") from None


def load_golden(path: Path) -> dict[str, np.ndarray]:
    """Golden outputs, refusing NaN: a reference with NaN in it cannot judge anything."""
    arrays = load_arrays(path)
    for name, array in arrays.items():
        if np.issubdtype(array.dtype, np.floating) and np.isnan(array).any():
            count = int(np.isnan(array).sum())
            raise SampleError(f"{path}: golden output '{name}' holds {count} NaN values; regenerate the golden outputs")
    return arrays
