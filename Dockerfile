FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache

WORKDIR /app
COPY . /app
# [jit]: numba, for the JIT backend and the semiring kernels (several times faster than NumPy's)
RUN pip install ".[jit]" ./plugins/semigrad-paths ./plugins/semigrad-logic

# Not root: a user of its own, owning only the data directory (the SQLite store's default place here).
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin semigrad \
    && mkdir -p /data && chown semigrad /data
USER 10001
ENV HOME=/home/semigrad SEMIGRAD_STORE=/data/graphs.sqlite

# Workers: one per CPU of the container's quota (cgroup cpu.max), not of the host.
EXPOSE 50051
EXPOSE 9100
CMD ["semigrad", "serve", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9100", "--metrics-host", "0.0.0.0"]
