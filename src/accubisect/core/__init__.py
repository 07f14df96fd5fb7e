"""Pure core: metrics, search strategies, graph mapping, precision policy, emulation. No ONNX Runtime, no HDF5,
no file I/O beyond packaged data.
"""
