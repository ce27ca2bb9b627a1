"""The seam to the model: backend protocol, Triton client, shared memory."""
