# syntax=docker/dockerfile:1.7
# Two images from one file:
#   docker build --target service -t microbatch-tuner .          # the API and dashboard, no torch
#   docker build --target worker  -t microbatch-tuner-worker .   # a GPU worker, with torch
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --system --create-home --uid 10001 tuner
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tuner/ tuner/
COPY migrations/ migrations/
# api/migrations is a link to ../migrations; the wheel build follows it.
COPY api/ api/

FROM base AS service
RUN pip install '.[server]' && mkdir /data && chown tuner:tuner /data
ENV TUNER_DATABASE_URL=sqlite:////data/tuner.db \
    TUNER_HOST=0.0.0.0 \
    TUNER_PORT=8000
VOLUME ["/data"]
USER tuner
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]
# Migrate first (SQLite on the volume, or the PostgreSQL in TUNER_DATABASE_URL), then serve.
CMD ["sh", "-c", "tuner db upgrade && exec tuner serve"]

FROM base AS worker
# PyPI's Linux build of torch is the CUDA build; pin the one your driver supports.
ARG TORCH_VERSION=2.13.0
RUN pip install "torch==${TORCH_VERSION}" '.[torch]'
COPY examples/ examples/
USER tuner
# Needs TUNER_URL and TUNER_TOKEN (a token with the worker scope). It runs only the
# workloads allowed here: the examples it carries; add your packages to the list.
ENV TUNER_WORKER_ALLOW=examples
CMD ["tuner", "worker"]
