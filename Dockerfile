# nanobot gateway in a container: the wheel, a non-root user, the home on a volume.
#   docker build -t nanobot .
#   docker run --rm -it -v nanobot-home:/var/lib/nanobot nanobot onboard
#   docker compose up -d            # with PostgreSQL: see compose.yaml
# The shell tool confines commands with Landlock and seccomp; where the container's own
# seccomp profile or kernel does not allow that, exec_command refuses and says how to opt out
# (tools.exec.sandbox) instead of running unconfined.

FROM python:3.11-slim AS build
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps -w /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/nanobot --shell /usr/sbin/nologin nanobot \
    && install -d -o nanobot -g nanobot -m 700 /var/lib/nanobot /etc/nanobot /srv/nanobot/workspace
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV NANOBOT_HOME=/var/lib/nanobot PYTHONUNBUFFERED=1
USER nanobot
WORKDIR /var/lib/nanobot
VOLUME ["/var/lib/nanobot"]
ENTRYPOINT ["nanobot"]
CMD ["gateway"]
