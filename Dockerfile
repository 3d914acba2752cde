# syntax=docker/dockerfile:1
#
# The operator image, the SECOND way: for users who build with Docker,
# BuildKit, buildah or podman. The first way needs no container engine:
#
#   skill-operator image self --registry HOST/REPO [--tag T]
#
# pushes an image of the running binary with registry calls only (empty
# base, the binary and exactly the shared libraries it links, CA bundle,
# /etc/passwd for 65532, no shell); see src/image/self_image.rs.
#
# NOT BUILT HERE: the machine this file was written on has no container
# engine, so it has never been built; treat it as reviewed, not tested. The
# base image digests below could not be resolved offline either: pin them
# (a tag can move) before use, e.g.
#
#   crane digest docker.io/library/rust:1.89-bookworm
#   crane digest gcr.io/distroless/static-debian12:nonroot
#
# and pass them as build args (or edit the defaults):
#
#   docker build \
#     --build-arg RUST_IMAGE=docker.io/library/rust:1.89-bookworm@sha256:<digest> \
#     --build-arg RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:<digest> \
#     -t HOST/REPO:TAG .
#   # multi-arch (each platform builds natively, under emulation if need be):
#   docker buildx build --platform linux/amd64,linux/arm64 ... --push .
#
# Stages:
#   build: Rust on Debian bookworm, a fully static musl binary (ring, rustls
#          and everything else compile for musl; no OpenSSL is linked), so
#          the final stage needs no libc.
#   final: distroless static: no shell, no package manager, CA certificates,
#          /etc/passwd with nonroot = 65532; we run as 65532:65532.

# pin: docker.io/library/rust:1.89-bookworm@sha256:<resolve with crane digest>
ARG RUST_IMAGE=docker.io/library/rust:1.89-bookworm
# pin: gcr.io/distroless/static-debian12:nonroot@sha256:<resolve with crane digest>
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${RUST_IMAGE} AS build
# musl-gcc for ring's C and assembly parts.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN rustup target add "$(uname -m)-unknown-linux-musl"
# Everything but target/ and .git (see .dockerignore): Cargo.toml names
# benches, and src/samples.rs embeds config/samples.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(uname -m)-unknown-linux-musl" \
 && cargo build --release --locked --bin skill-operator --target "$target" \
 && install -D -m 0755 "target/$target/release/skill-operator" /out/skill-operator \
 && /out/skill-operator --version

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/skill-operator /usr/local/bin/skill-operator
# Numeric, so Pod Security "restricted" (runAsNonRoot) can check it.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/skill-operator"]
