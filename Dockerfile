# tokenmill's container image: `tokenmill serve` (the default) or, with another command line,
# `gateway` and `worker` (deploy/kubernetes runs /usr/local/bin/tokenmill with its own args).
# Debian 12 as everywhere else; the build stage has the -dev packages scripts/deps.sh installs
# for the build, the runtime stage only their libraries, curl for the healthcheck and a user
# without privileges. No model inside: mount one at /models (or name another with -m).
#
#   podman build -t tokenmill:latest .        (or: buildah bud, docker build)
#   podman run -p 8080:8080 -v ./models:/models:ro tokenmill:latest
FROM docker.io/library/debian:12 AS build
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      build-essential pkg-config libpcre2-dev libssl-dev libjansson-dev libmicrohttpd-dev libisal-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile ./
COPY src ./src
COPY models ./models
# the binary only (the tests need node and the test data); the SIMD level is picked at run time
RUN make -j"$(nproc)" build/tokenmill

FROM docker.io/library/debian:12-slim
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libpcre2-8-0 libssl3 libjansson4 libmicrohttpd12 libisal2 curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/tokenmill --create-home tokenmill \
 && mkdir -p /models /store && chown tokenmill:tokenmill /store
COPY --from=build /src/build/tokenmill /usr/local/bin/tokenmill
COPY --from=build /src/models/stories260K.gguf /usr/share/tokenmill/stories260K.gguf
USER tokenmill
WORKDIR /var/lib/tokenmill
EXPOSE 8080
# /health: 200 when serving, 503 while loading or draining (so a draining container is unhealthy)
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:8080/health || exit 1
ENTRYPOINT ["/usr/local/bin/tokenmill", "serve"]
CMD ["-m", "/models/model.gguf", "--host", "0.0.0.0", "--port", "8080"]
