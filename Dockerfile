# CUDA-capable runtime image for `elmo-cache serve` (and `build`).
# Not built in this project's CI (no Docker engine there); see README "Docker".
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    ELMO_CACHE_MODELS=/models

WORKDIR /opt/elmo-cache
COPY setup.cfg pyproject.toml README.md ./
COPY elmo_cache ./elmo_cache
COPY cli ./cli
COPY server ./server
# torch comes from the base image (CUDA build); the project's range accepts it. The server extra
# brings FastAPI, uvicorn, orjson and prometheus-client, which `serve` (the default command) needs.
RUN pip install ".[server]" && useradd --create-home elmo && mkdir -p /models /data && chown elmo /models /data

USER elmo
VOLUME ["/models", "/data"]
EXPOSE 8000
ENTRYPOINT ["elmo-cache"]
# By default the model bundled in the image answers live (no download); pass a cache path to serve it:
#   docker run --gpus all -p 8000:8000 -v $PWD:/data IMAGE serve /data/corpus.zarr --host 0.0.0.0
# (without --model, a cache is served with the model that built it when it is in the image or in /models;
#  --model original downloads the published model once into /models)
CMD ["serve", "--model", "bundled", "--host", "0.0.0.0", "--port", "8000"]
