# bub-bot: docker build -t bub-bot . && docker run --env-file .env -p 8080:8080 -v bub-data:/data bub-bot
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# bubblewrap: the bash tool's sandbox where the container may create user namespaces (else the
# bot uses its Landlock helper; README "Acting tools and the sandbox").
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*

# Dependencies in their own layer: rebuilt only when pyproject.toml changes.
COPY pyproject.toml README.md ./
RUN mkdir -p bub_bot channels \
    && touch bub_bot/__init__.py channels/__init__.py \
    && pip install . \
    && pip uninstall -y bub-bot

COPY bub_bot ./bub_bot
COPY channels ./channels
RUN pip install --no-deps . \
    && useradd --create-home --uid 10001 bub \
    && mkdir -p /data \
    && chown bub:bub /data

USER bub
ENV BUB_HOME=/data \
    BUB_WORKSPACE=/data/workspace \
    PORT=8080
VOLUME ["/data"]
EXPOSE 8080

HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8080'), timeout=4)"

CMD ["bub-bot", "serve"]
