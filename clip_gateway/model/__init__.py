"""The model contract the exporter writes and the server reads: tensor names and config parameters
(`contract.py`), what an export is and where it lives (`spec.py`), the quality gate
(`gate.py`) and its calibration set (`calibration.py`). Imports nothing else of ours."""
