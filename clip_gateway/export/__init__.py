"""OpenCLIP → ONNX export of both towers, preprocessing folded into the image graph, the tokenizer
written beside them (`python -m clip_gateway.export -h`)."""
