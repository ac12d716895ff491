# One image for every ampci service (api, beat, workers).  BASE_IMAGE selects the runtime:
#   python:3.12-slim                              CPU services (default)
#   nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04  worker-cuda (CUDA/cuDNN for onnxruntime-gpu)
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# git: workers keep a bare clone of the pass repository and worktrees per revision.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git ca-certificates \
 && if ! command -v python3 >/dev/null || ! python3 -c "import venv, ensurepip" 2>/dev/null; then \
        apt-get install -y --no-install-recommends python3 python3-venv; fi \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/ampci \
 && useradd --create-home --uid 10001 ampci \
 && mkdir -p /var/cache/ampci /var/lib/ampci \
 && chown ampci:ampci /var/cache/ampci /var/lib/ampci
ENV PATH=/opt/ampci/bin:$PATH \
    AMPCI_CACHE_DIR=/var/cache/ampci \
    AMPCI_DATA_DIR=/var/lib/ampci

WORKDIR /app
# Dependencies first (cached layer), then the code.  The checkout (with .git) doubles as the
# default pass repository that workers clone from (AMPCI_PASS_REPO, default /app).
COPY pyproject.toml README.md ./
RUN mkdir -p amp_pass workers service migrations \
 && touch amp_pass/__init__.py workers/__init__.py service/__init__.py migrations/__init__.py \
 && pip install . && pip uninstall -y ampci
COPY . .
RUN pip install --no-deps -e . && git config --system --add safe.directory /app
USER ampci
CMD ["ampci", "--help"]
