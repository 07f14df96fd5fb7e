"""Exceptions a user can act on. Each message is one line naming the file or key and what to do."""


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
