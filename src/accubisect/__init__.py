"""accubisect: find the graph fusion or precision change that makes a compiled ONNX model inaccurate."""

__version__ = "0.1.0"
