"""OpenCLIP → ONNX export, preprocessing folded into the graph (`python -m export -h`)."""
