# syntax=docker/dockerfile:1
# The Turnwire sidecar image. Build at the repository root:
#   docker build -t turnwire:0.1.0 .
# Checked statically by tests/test_dockerfile.py (no container daemon runs in CI).
#
# Base image: an exact Python patch release on Debian 12 (bookworm), slim. To refresh it, take
# the newest python:3.11.<patch>-slim-bookworm tag from the Docker Hub "python" page, set it
# below, and pin what it resolves to:
#   docker buildx imagetools inspect python:3.11.<patch>-slim-bookworm   # prints "Digest: sha256:…"
# then write PYTHON_IMAGE=python:3.11.<patch>-slim-bookworm@sha256:… (the tag stays for readers;
# the digest is what is pulled). Rebuild for the base's security updates.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# The cloud platforms' SDKs stay out of the default image (boto3 and botocore alone are ~90 MB).
# To serve bedrock:, vertex: or gemini: models, name their extras (docs/install.md):
#   docker build --build-arg EXTRAS=bedrock,gemini -t turnwire:0.1.0-cloud .
ARG EXTRAS=""

# --- builder: wheels of the three distributions and every runtime dependency, pinned -----------
FROM ${PYTHON_IMAGE} AS builder
ARG EXTRAS
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_NO_INPUT=1
WORKDIR /src
# VERSION: every distribution's version (clients/python/VERSION and middleware/VERSION link to it).
COPY constraints.txt pyproject.toml README.md VERSION ./
COPY server/ server/
COPY middleware/ middleware/
COPY clients/python/ clients/python/
# No [dev] extra: only what `turnwire` needs at run time becomes a wheel, at the versions
# constraints.txt pins. The dependencies publish binary wheels for CPython 3.11 on Linux, so the
# slim base (no compiler) suffices; one that needed compiling would fail here, not at run time.
RUN pip wheel --wheel-dir /wheels -c constraints.txt ./clients/python ./middleware ".${EXTRAS:+[$EXTRAS]}"

# --- runtime: the wheels installed offline, a non-root user, a data directory -------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG EXTRAS
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# --no-index: nothing but the builder's wheels. The bind mount keeps them out of every layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels "turnwire${EXTRAS:+[$EXTRAS]}"
# A fixed UID/GID (10001), numeric in USER so that Kubernetes' runAsNonRoot can verify it.
# /var/lib/turnwire is the working directory, so the default store (sqlite:///turnwire.db)
# lives there: mount a volume on it to keep conversations across containers.
RUN groupadd --system --gid 10001 turnwire \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /var/lib/turnwire --shell /usr/sbin/nologin turnwire \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/turnwire
WORKDIR /var/lib/turnwire
USER 10001:10001
EXPOSE 50051
# app.py: SIGTERM drains (health NOT_SERVING while calls are still taken for limits.drain_seconds,
# 5 s by default; then running turns get limits.shutdown_grace_seconds, 10 s, plus 5 s for their
# last events); give `docker stop` a longer --time.
STOPSIGNAL SIGTERM
# `turnwire health` asks TURNWIRE_TARGET (default 127.0.0.1:50051): set it when listening elsewhere.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["turnwire", "health", "--timeout", "4"]
ENTRYPOINT ["turnwire"]
CMD ["serve", "--listen", "0.0.0.0:50051"]
