# One image for every ampci service (api, beat, migrate, workers).  Build arguments:
#   BASE_IMAGE   python:3.12-slim (default; with a registry)  |  local/python:3.11 (deploy/images.py,
#                no registry)  |  nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04 (worker-cuda)
#   ONNXRUNTIME  onnxruntime (default: CPU, no CUDA wheels)  |  onnxruntime-gpu (worker-cuda)
# Everything runs as the service user `ampci` (uid 10001), which owns /app (the checkout with .git:
# the pass repository of runs whose webhook names none; git refuses a repository owned by
# another user) and the cache/data directories (named volumes mounted there start owned by it).
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}
ARG ONNXRUNTIME=onnxruntime

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
 && mkdir -p /var/cache/ampci /var/lib/ampci /app \
 && chown ampci:ampci /var/cache/ampci /var/lib/ampci /app
ENV PATH=/opt/ampci/bin:$PATH \
    AMPCI_CACHE_DIR=/var/cache/ampci \
    AMPCI_DATA_DIR=/var/lib/ampci

WORKDIR /app
# Dependencies first, from pyproject.toml alone (this layer is rebuilt only when it changes), with
# onnxruntime-gpu swapped for ${ONNXRUNTIME}.  Then the code, owned by the service user.
COPY pyproject.toml /tmp/pyproject.toml
RUN python3 -c "import sys, tomllib; deps = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies']; \
print('\n'.join(sys.argv[1] + d[len('onnxruntime-gpu'):] if d.startswith('onnxruntime-gpu') else d for d in deps))" \
        "${ONNXRUNTIME}" > /tmp/requirements.txt \
 && cat /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/pyproject.toml /tmp/requirements.txt
# The digest of the code as copied (deploy/source_digest.py): docker-compose.yml starts every service through
# `source_digest.py run`, which compares it with the checkout's code and refuses to start a stale image.
COPY --chown=10001:10001 . .
RUN python3 deploy/source_digest.py write /app /opt/ampci/source-digest.json \
 && pip install --no-deps -e . \
 && chown -R ampci:ampci /app
USER ampci
# The pass repository must resolve for the service user, and no .env (secrets) may be in the image.
RUN test ! -e /app/.env && git -C /app rev-parse --verify -q HEAD >/dev/null
CMD ["ampci", "--help"]
