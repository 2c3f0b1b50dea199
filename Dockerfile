# Production image on NVIDIA's Triton container, which brings its own tritonserver with the python,
# onnxruntime, TensorRT and TensorRT-LLM backends. The model repository is NOT baked in: build it with
# `make models PROFILE=hf` on a machine with hub access (or the GPU targets, when they land) and mount it.
#
#   docker build -t thinkserve .
#   docker run --gpus all -p 50051:50051 -v $PWD/model_repository/hf:/models -v thinkserve-data:/data thinkserve
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.10-trtllm-python-py3
FROM ${TRITON_IMAGE}

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/thinkserve

# Triton's model environment: the container's own Python, which its python-backend stub was built for,
# with numpy<2 (the stub corrupts tensors with numpy 2).
COPY requirements/triton-models.txt requirements/
COPY build/backend build/backend
RUN python3 -m venv .venv-triton \
 && .venv-triton/bin/pip install --no-cache-dir -c requirements/triton-models.txt ./build/backend

# The orchestrator (Python 3.11). Runtime dependencies only: the model compiler's torch stack stays out.
COPY . .
RUN python3.11 -m venv .venv \
 && .venv/bin/pip install --no-cache-dir -c requirements/project.txt . \
 && .venv/bin/pip install --no-cache-dir --no-deps ./build/backend

EXPOSE 50051
VOLUME ["/data"]
ENTRYPOINT ["/opt/thinkserve/.venv/bin/thinkserve", "--config", "/opt/thinkserve/deploy/container.toml"]
CMD ["serve"]
