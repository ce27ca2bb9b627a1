"""The bench's harness: what the studies and the tests share (photos, the launch path, load,
clients, the real stack, model repositories, results writing). Nothing here imports a study."""
