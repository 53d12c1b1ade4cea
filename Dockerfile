# syntax=docker/dockerfile:1
# llamacpp-exporter: the Prometheus exporter/alerting sidecar for llama.cpp's llama-server.
#
#   docker build -t llamacpp-exporter .
#   docker run --rm -v llama-logs:/var/log/llama:ro -p 9778:9778 llamacpp-exporter \
#       --log-file /var/log/llama/llama-server.log --server-url http://llama-server:8080
#
# Two stages: the first installs the package and its dependencies (pure wheels: no compiler) into
# a virtual environment; the second copies only that environment onto a clean slim image, so no
# pip cache, build tree or build tool is left in. Runs as uid/gid 10001 (not root); give llama-server
# the same uid when the exporter should read its /proc/<pid>/environ (see docker-compose.yml).
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN python -m venv /opt/llamacpp-exporter \
    && /opt/llamacpp-exporter/bin/pip install --no-cache-dir /src \
    && /opt/llamacpp-exporter/bin/pip uninstall --yes pip \
    && /opt/llamacpp-exporter/bin/llamacpp-exporter --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="llamacpp-exporter" \
      org.opencontainers.image.description="Prometheus exporter and alerting sidecar for llama.cpp's llama-server" \
      org.opencontainers.image.licenses="MIT"
RUN groupadd --system --gid 10001 llamacpp-exporter \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin llamacpp-exporter
COPY --from=build /opt/llamacpp-exporter /opt/llamacpp-exporter
ENV PATH=/opt/llamacpp-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LLAMACPP_EXPORTER_LISTEN_ADDRESS=0.0.0.0:9778
USER 10001:10001
EXPOSE 9778
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-m", "exporter.web.healthcheck"]
ENTRYPOINT ["llamacpp-exporter"]
CMD ["--help"]
