"""CLIP image-embedding gateway: compact JPEG batches in, embeddings out, Triton behind it."""

__version__ = "0.1.0"
