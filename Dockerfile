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

EXPOSE 50051
CMD ["semigrad", "serve", "--host", "0.0.0.0", "--port", "50051"]
