"""Baseline A, "PyTorch FastAPI": base64 JPEGs in JSON, PIL full decode, open_clip's transforms,
the torch model in-process. Written as the background reports describe their first server.

Run: ``python -m bench.baselines.pytorch_fastapi --port P [--seed 0]`` (uvicorn, one worker).
The bench starts it with stock Pillow first on PYTHONPATH, as such a server would have.
"""

from __future__ import annotations

import argparse
import base64
import io

import open_clip
import torch
import uvicorn
from fastapi import FastAPI
from PIL import Image
from pydantic import BaseModel

from clip_gateway.export.model import load
from clip_gateway.model.spec import DEFAULT_MODEL, Weights


class EmbedRequest(BaseModel):
    images: list[str]


def create_app(seed: int) -> FastAPI:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = load(DEFAULT_MODEL, Weights.random(seed))  # the weights the ONNX file was made from
    model = loaded.clip.to(device).eval()
    _, _, preprocess = open_clip.create_model_and_transforms(DEFAULT_MODEL, pretrained=None)
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "device": device}

    @app.post("/embed")
    def embed(request: EmbedRequest) -> dict[str, list[list[float]]]:
        images = [
            preprocess(Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB"))
            for b in request.images
        ]
        with torch.no_grad():
            features = model.encode_image(torch.stack(images).to(device))
            features = features / features.norm(dim=-1, keepdim=True)
        return {"embeddings": features.cpu().tolist()}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    uvicorn.run(create_app(args.seed), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
