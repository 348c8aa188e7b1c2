# token-broker's container image.
#   docker build -t token-broker .
#   docker run --rm -p 8080:8080 -p 9090:9090 token-broker
#
# No Docker engine runs on the project's build machines, so `make test` proves the runtime stage
# another way (Tests/container/runtime-check.sh): it builds a Debian bookworm minbase root,
# installs exactly RUNTIME_PACKAGES below, and runs the release binary there as a non-root user.

# --- build: the Swift 6.3 toolchain on Debian bookworm ---
FROM swift:6.3-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends libmicrohttpd-dev libssl-dev libcurl4-openssl-dev libhiredis-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Package.swift ./
COPY Sources ./Sources
# The Swift standard library is linked in (the broker uses no Foundation); only Debian's C libraries stay shared.
RUN swift build -c release --static-swift-stdlib \
    && install -m 0755 -s "$(swift build -c release --show-bin-path)/token-broker" /token-broker

# --- runtime: bookworm-slim with only the shared libraries the binary links ---
FROM debian:bookworm-slim
# libmicrohttpd12: the server; libssl3: libcrypto; libcurl4: the OpenSSL-flavoured client;
# ca-certificates: to verify upstream issuers over TLS.
ARG RUNTIME_PACKAGES="libmicrohttpd12 libssl3 libcurl4 libhiredis0.14 ca-certificates"
RUN apt-get update \
    && apt-get install -y --no-install-recommends ${RUNTIME_PACKAGES} \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin token-broker
COPY --from=build /token-broker /usr/local/bin/token-broker
USER 10001:10001
# Inside the container the listeners face the container's network; publish only what you mean to.
ENV TOKEN_BROKER_LISTEN=0.0.0.0:8080 \
    TOKEN_BROKER_ADMIN_LISTEN=0.0.0.0:9090
EXPOSE 8080 9090
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["token-broker", "healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["token-broker"]
