"""Text input for the text tower: open_clip's tokenizers, reproduced without torch."""
