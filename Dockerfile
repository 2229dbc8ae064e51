# autom: webhooks in, reliable work out. Build: docker build -t autom .
# Runs `autom run` (migrations ship inside the wheel and are applied at start).
# compose.yml beside this file runs it with its PostgreSQL; README.md, "Deployment".

# One base for both stages: the virtualenv built in the first is copied into the
# second and must find the same Python at the same path.
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm

# ---- build: a virtualenv with the pinned dependencies and autom's wheel ----------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
WORKDIR /src

# The dependencies alone first: this layer is rebuilt only when constraints.txt changes.
# constraints.txt is exactly what `pip install .` needs, no extra: the embedded PostgreSQL
# of `autom dev` (the `embedded` extra, 74 MB) stays out of the image, which talks to a
# real server. Installed, this set is 39 MB (115 MB when the embedded one was in it).
COPY constraints.txt ./
RUN /opt/venv/bin/pip install --no-cache-dir --requirement constraints.txt

# Then autom itself, built with the pinned setuptools (no build isolation: nothing
# unpinned is fetched) and resolved against the constraints without an index, so a
# dependency added to pyproject.toml but not to constraints.txt fails the build here.
# The last check proves the migrations are inside the installed package (-I: not the
# autom/ source folder in this working directory).
COPY pyproject.toml README.md ./
COPY migrations/ migrations/
COPY autom/ autom/
RUN /opt/venv/bin/pip install --no-cache-dir --no-index --no-build-isolation --constraint constraints.txt . \
 && /opt/venv/bin/pip check \
 && /opt/venv/bin/python -I -c "import autom.migrations, importlib.resources as r; \
assert any(f.name.endswith('.sql') for f in r.files('autom.migrations').iterdir())"

# ---- runtime: the virtualenv, a non-root user, nothing else -----------------------
FROM ${PYTHON_IMAGE}

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# A system user and group with a fixed id (volumes and Kubernetes runAsUser can name it).
RUN groupadd --system --gid 10001 autom \
 && useradd --system --no-log-init --uid 10001 --gid 10001 --create-home --home-dir /app \
        --shell /usr/sbin/nologin autom

COPY --from=build /opt/venv /opt/venv

WORKDIR /app
# numeric, so a runtime (Kubernetes runAsNonRoot) can tell it is not root
USER 10001:10001

EXPOSE 8000

# autom drains on SIGTERM: intake stops, running jobs get SHUTDOWN_GRACE_SECONDS
# (default 50), unfinished ones go back to the queue. Give the container longer than
# that before it is killed (compose.yml: stop_grace_period: 60s).
STOPSIGNAL SIGTERM

# No curl in a slim image: Python asks /health (200 when the database answers).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % (os.environ.get('PORT') or '8000'), timeout=3)"]

# Exec form: autom is PID 1 and receives SIGTERM itself (no shell in between).
CMD ["autom", "run"]
