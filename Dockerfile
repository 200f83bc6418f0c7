# The server on the CPU build of torch, as the README installs it, as a non-root user.
#   docker build -t batching:0.1.0 . && docker run -p 8000:8000 -p 8001:8001 batching:0.1.0
# (the tag deploy/kubernetes/base/deployment.yaml pulls: the version in pyproject.toml)
# The server reads its CPU budget from the container (docker run --cpus, a pod's CPU limit).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

RUN useradd --create-home --uid 10001 --user-group app
WORKDIR /app
COPY . /app

# The README's install command: no GPU in the build, so scripts/install.py installs torch's CPU
# build from PyTorch's CPU index (no multi-GB CUDA build), and says so.
RUN python scripts/install.py

# The engine cache in the image: the default model exported, checked and timed at build time
# (python server.py --prepare), so a container starts from it in seconds instead of exporting
# and measuring first. The measurements are keyed by the CPU model and thread budget: where the
# container's differ from the build machine's, it measures again at its first start (in a
# child process, reusing the export). Serve other models? Pass the same flags to --prepare.
ENV BATCHING_ENGINE_CACHE=/app/engines
RUN python server.py --prepare && chown -R app:app /app/engines

USER 10001
EXPOSE 8000 8001
ENTRYPOINT ["python", "server.py"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--grpc-port", "8001"]
