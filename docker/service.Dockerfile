# The Orchard service image: gateway and scheduler (kubernetes backend).
# Build from the repository root:
#   docker build -f docker/service.Dockerfile -t orchard/orchard:0.1.0 .
# (Not built in CI: these machines have no Docker daemon and no registry.)
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY services ./services
RUN pip install ".[server,kubernetes]" && rm -rf /src

# Runs as a fixed non-root uid (the chart sets runAsNonRoot and this uid).
RUN useradd --uid 10001 --home-dir /var/lib/orchard --create-home orchard
USER 10001
WORKDIR /var/lib/orchard
ENTRYPOINT []
CMD ["python", "-m", "orchard.gateway", "--help"]
