# Hindsight: one image for both the web (gunicorn) and the worker (celery) containers.

# The incident page's plotly.js: a bundle of only the trace types it draws, built from the npm
# versions pinned in assets/package-lock.json (scripts/assets.sh does the same outside Docker).
# The image takes only the built file from this stage, not Node.js.
FROM node:20-slim AS assets
WORKDIR /assets
COPY assets/package.json assets/package-lock.json ./
RUN npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
COPY assets/plotly-timeline.js assets/build.js ./
RUN node build.js

# The C scanner of audit-log ingest (scripts/native.sh), built where a compiler is; the image
# takes only the module.
FROM python:3.11 AS native
WORKDIR /src
COPY scripts/native.sh scripts/
COPY timelines/parsers/_auditscan.c timelines/parsers/
RUN PYTHON_BIN=python bash scripts/native.sh

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HINDSIGHT_DATA_DIR=/data

WORKDIR /app

# Install dependencies before copying the code so that a code change does not reinstall them.
# psycopg[binary] bundles libpq, so the image needs no compiler or system packages.
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

# Run as a non-root user. /data must belong to that user: the first time Docker mounts an empty
# named volume there, it copies this directory's owner into the volume, so web and worker can
# write uploads to it.
RUN useradd --create-home --uid 1000 hindsight \
 && mkdir -p /data \
 && chown hindsight:hindsight /data

# The code stays owned by root, so the app user cannot change it. settings.py serves the
# plotly.js bundle because it is there (collectstatic below collects it).
COPY . .
COPY --from=assets /assets/dist/plotly-timeline.min.js assets/dist/
COPY --from=native /src/timelines/parsers/_auditscan.*.so timelines/parsers/
# The code's bytecode, compiled once here: PYTHONDONTWRITEBYTECODE keeps processes from writing
# it at run time, so without this every process would compile the project's modules again.
RUN python -m compileall -q hindsight incidents timelines streams

USER hindsight

# STATIC_ROOT is $HINDSIGHT_DATA_DIR/static. The named volume keeps the copy from its first
# image. That is harmless: WHITENOISE_USE_FINDERS serves the files from the current image's code
# instead of the old copy. settings.py only needs a SECRET_KEY to load, so a throwaway one is
# set for this step alone and is not kept in the image.
RUN SECRET_KEY=collectstatic-build-only python manage.py collectstatic --noinput

EXPOSE 8000

# Large audit-log uploads stream through a sync worker, which would be killed after the default
# 30 s timeout; 300 s allows for multi-GB files. The heartbeat files go in /dev/shm (RAM), so
# a slow disk cannot make workers look stuck.
CMD ["gunicorn", "hindsight.wsgi:application", \
     "--bind", "0.0.0.0:8000", "--workers", "2", "--timeout", "300", \
     "--worker-tmp-dir", "/dev/shm", "--access-logfile", "-"]
