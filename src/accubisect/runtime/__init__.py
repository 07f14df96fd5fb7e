"""The runtime: the only code that imports onnxruntime (sessions, compiling, the rule catalogue)."""
