"""The seam to the model: backend protocol, tensor contract, Triton client, shared memory,
model repository rendering, the local tritonserver process."""
