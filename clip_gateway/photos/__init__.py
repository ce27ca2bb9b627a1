"""The photo-library app: embed a folder, search it, review near-duplicates (the `clip-gateway`
client commands)."""
