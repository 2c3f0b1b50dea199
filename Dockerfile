# Production image: the orchestrator on NVIDIA's Triton container, whose own tritonserver and backends serve the
# model repository. The repository is mounted, not baked in: build it with `make models PROFILE=hf` on a machine
# with hub access and mount it at /models.
#
#   docker build -t thinkserve .                                  # python, onnxruntime and TensorRT backends
#   docker build -t thinkserve --build-arg TRITON_FLAVOUR=trtllm .  # + TensorRT-LLM (see below)
#   docker run --gpus all --shm-size=2g -p 50051:50051 -p 50052:50052 \
#     -v $PWD/model_repository/hf:/models:ro -v thinkserve-data:/data \
#     -v $PWD/tokens.toml:/run/secrets/thinkserve-tokens.toml:ro thinkserve
#
# Ports: 50051 gRPC, 50052 HTTP (the OpenAI endpoint /v1, the JSON API and console, /metrics). Both listen on
# every interface (deploy/container.toml), which the server allows only with token grants: the mounted file above
# (`thinkserve token --name app --collections '*' --write` makes one), or grants in the environment (see
# container.toml). --shm-size: Triton's python backend hands every tensor over in /dev/shm, one region per model
# instance that grows to about twice its largest tensor and never shrinks; Docker's default of 64 MB fails the
# models' loads or requests. 2 GB is what deploy/compose.yaml and the Kubernetes manifest give Triton.
# The image runs as uid 10001: a bind-mounted /data must be writable by it (a named volume takes /data's owner).
#
# Base image (never built or pulled here: the development machines have no Docker engine; chosen from NVIDIA's
# published Triton release notes and compatibility matrix, November 2026):
# - `<yy.mm>-py3` carries the python, onnxruntime and TensorRT backends (and others); `<yy.mm>-trtllm-python-py3`
#   the TensorRT-LLM and python backends only. The cpu target needs the python backend alone, which both have;
#   the torch target needs a CUDA torch in .venv-triton (the trtllm flavour's, below); the gpu target's
#   TensorRT-LLM engines need the trtllm image (its engines are built by <repository>.engines/build_engines.sh in
#   the same image and mounted at /engines). The default is -py3:
#   every backend in it is built by NVIDIA against the same TensorRT. TRITON_FLAVOUR=trtllm builds on the trtllm
#   image and adds the onnxruntime backend of the -py3 image of the same release, as NVIDIA's customisation
#   guide says to extend that image (its compose.py cannot add TensorRT-LLM to -py3). The two 25.06 images share
#   CUDA 12.9, but the trtllm image's TensorRT (10.10.0.31) need not be the one that onnxruntime backend was built
#   against: its TensorRT execution provider there is unproven. Either way the launcher checks every model's
#   backend against the installation before Triton starts: a repository built for a backend the image lacks is
#   refused in one line.
# - 25.06: both flavours are Ubuntu 24.04 with Python 3.12.3 and CUDA 12.9. Later -py3 images moved to CUDA 13,
#   and faiss-gpu on PyPI is built for CUDA 12 only: the `gpu` extra (faiss-gpu, cupy-cuda12x) matches this one.
#   Both environments use the container's python3 (3.12), the Python its python-backend stub is built for; every
#   pin of requirements/triton-models.txt (torch aside: its CPU build there is for the torch target on CPU
#   machines) and of the project's runtime set in requirements/project.txt has a cp312 wheel (checked with
#   `pip install --dry-run --only-binary=:all: --python-version 3.12`; jieba is a pure-Python sdist). The 24.10
#   image this replaces had Python 3.10, with no onnxruntime 1.31.1 wheel.
ARG TRITON_RELEASE=25.06
ARG TRITON_FLAVOUR=py3

FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3 AS triton-py3

FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-trtllm-python-py3 AS triton-trtllm
COPY --from=triton-py3 /opt/tritonserver/backends/onnxruntime /opt/tritonserver/backends/onnxruntime

FROM triton-${TRITON_FLAVOUR}
ARG TRITON_FLAVOUR
# The orchestrator's extras: `gpu` (faiss-gpu, CuPy; each runs on the CPU when it finds no GPU) or `cpu`.
ARG THINKSERVE_EXTRAS=gpu

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 --user-group thinkserve \
 && mkdir -p /data/tensorrt-cache \
 && chown -R thinkserve:thinkserve /data
WORKDIR /opt/thinkserve

# Triton's model environment: the container's own Python, which its python-backend stub was built for,
# with numpy<2 (requirements/triton-models.txt). The torch and gpu targets' models (`thinkserve-build --target
# torch|gpu`: PyTorch networks, the VLM's vision tower, the TensorRT-LLM adapters) need PyTorch with CUDA: the
# trtllm image has it (TensorRT-LLM depends on it), so that flavour's environment sees the container's packages
# and adds the backend's `torch` extra without the CPU build pinned for the development machines.
COPY requirements/ requirements/
COPY backend backend
RUN if [ "$TRITON_FLAVOUR" = trtllm ]; then \
      python3 -m venv --system-site-packages .venv-triton && backend="./backend[torch]"; \
    else python3 -m venv .venv-triton && backend=./backend; fi \
 && grep -v '^torch==' requirements/triton-models.txt > /tmp/model-constraints.txt \
 && .venv-triton/bin/pip install --no-cache-dir -c /tmp/model-constraints.txt "$backend" \
 && rm /tmp/model-constraints.txt

# The orchestrator, on the same Python. Runtime dependencies only: the model compiler's torch stack stays out.
COPY . .
RUN python3 -m venv .venv \
 && .venv/bin/pip install --no-cache-dir -c requirements/project.txt ".[${THINKSERVE_EXTRAS}]" \
 && .venv/bin/pip install --no-cache-dir --no-deps ./backend

USER 10001:10001
# numba's compiled kernels (orchestrator/knowledge/graph/graph_kernels.py) are cached on the data volume: the first
# start compiles them (3 s, in the background warm-up), later starts load them (0.3 s)
ENV NUMBA_CACHE_DIR=/data/.numba-cache
EXPOSE 50051 50052
VOLUME ["/data"]
# grpc.health.v1 on loopback, no token: SERVING once every model is ready (loading an hf repository takes minutes).
HEALTHCHECK --interval=15s --timeout=10s --start-period=600s --retries=3 \
  CMD ["/opt/thinkserve/.venv/bin/thinkserve", "--config", "/opt/thinkserve/deploy/container.toml", "health", "--probe"]
ENTRYPOINT ["/opt/thinkserve/.venv/bin/thinkserve", "--config", "/opt/thinkserve/deploy/container.toml"]
CMD ["serve"]
