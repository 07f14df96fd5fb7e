"""Every exception the library raises, in one place. An `AccubisectError` is one a user can act on: its message
is one line naming the file or key and what to do, and the workflow reports it as a one-line failure. The two
that are not (`StepError`, `ShapeMismatch`) are programming mistakes and keep their traceback."""


class AccubisectError(Exception):
    """Base of every error the workflow reports as a one-line failure."""


class ConfigError(AccubisectError):
    """The workflow configuration is malformed."""


class ModelError(AccubisectError):
    """The ONNX model is missing, unreadable or rejected by the runtime."""


class SampleError(AccubisectError):
    """A sample file is missing, unreadable or does not match the model."""


class RuleError(AccubisectError):
    """A fusion rule name or a fusion switch file is invalid."""


class DumpError(AccubisectError):
    """A dump file is missing, unreadable or inconsistent."""


class GraphError(AccubisectError):
    """A graph JSON file is missing or does not describe the dump it is used with."""


class BackendError(AccubisectError):
    """The runtime cannot run the model as the configured backend asks."""


class WorkspaceError(AccubisectError):
    """A workspace file is damaged (edited, truncated, or not written by this version)."""


class FinalizeError(AccubisectError):
    """The mixed-precision model could not be made or does not load; the answer itself is published."""


class PreconditionError(AccubisectError):
    """The bisection cannot find an answer for this model and configuration."""


class BundleError(AccubisectError):
    """A bundle is missing, unreadable or not one accubisect wrote."""


class StepError(TypeError):
    """A rule and its step record disagree on the names: a wiring mistake, reported with both name lists."""


class UsageError(AccubisectError):
    """The command line itself is wrong: an unknown option, a missing argument, a value out of range."""


class PruneError(AccubisectError):
    """The workspace cannot be pruned as asked."""


class ShapeMismatch(ValueError):
    def __init__(self, reference: tuple[int, ...], candidate: tuple[int, ...]) -> None:
        super().__init__(f"shapes differ: reference {list(reference)}, candidate {list(candidate)}")


class PrecisionError(AccubisectError):
    """A precision setting (mixlist, keep_dtype, mode) is invalid."""


class RevertError(AccubisectError):
    """A fused instance cannot be replaced by the original nodes it absorbed (`core/hybrid.py`)."""


class ReduceError(AccubisectError):
    """`snakemake reduce` cannot write a repro that fails as written and passes with the answer."""
