# syntax=docker/dockerfile:1
# attnserve_server image, built exactly as the README's set-up builds it: deploy/setup.sh installs
# the Debian 12 packages, then the `release` CMake preset builds. There is no second package list
# here to drift: the runtime stage takes its libraries from setup.sh --runtime-only.
#
#   docker build -t attnserve .                        # CUDA 12.6 toolkit in the build stage
#   docker build --build-arg WITH_CUDA=0 -t attnserve .  # CPU only, smaller
#   docker run --rm -p 50051:50051 -p 9464:9464 attnserve   # add --gpus all on a GPU host
#   (or deploy/compose.yaml, which adds Prometheus and Grafana)
#
# Ports: 50051 gRPC (attnserve.v1.AttentionService, grpc.health.v1, reflection); 9464 Prometheus
# metrics at /metrics. The server's default --backend=auto takes the GPU when the container has a
# usable one (and this image was built WITH_CUDA=1), else the CPU, and logs which and why. The
# health check asks grpc.health.v1 through `attnctl health` on the port the server bound
# (deploy/healthcheck.sh reads the --port_file the ENTRYPOINT sets), so a --listen given in the
# command moves it too.
#
# Why debian:12 and not nvidia/cuda:*-devel-ubuntu*: setup.sh and the build target Debian 12's
# packages (gRPC 1.51, protobuf 3.21, Abseil 20220623, prometheus-cpp 1.0, CMake 3.25). NVIDIA
# publishes no Debian-based CUDA images, and Ubuntu 22.04's CMake (3.22) is older than our presets'
# 3.25 minimum while its gRPC/Abseil differ, so an Ubuntu base would need a second recipe. The
# CUDA devel and runtime layers come instead from NVIDIA's own CUDA apt repository for Debian 12,
# into /usr/local/cuda, where the build finds nvcc (CMakeLists.txt, ATTNSERVE_CUDA=AUTO) as on a
# developer machine.
#
# tests/deploy/check_deploy_files.py checks that the files it copies exist and that it uses
# setup.sh and the release preset; tests/image/image_test.sh builds the CPU image with podman from
# a Debian 12 base made by mmdebstrap and runs it (health on a non-default port, backend auto,
# attnctl demo, non-root), and tests/image/compose_test.sh runs it under deploy/compose.yaml with
# Prometheus (docs/deploy.md).

ARG WITH_CUDA=1
ARG CUDA_VERSION=12.6
# The Debian 12 images the stages start from. Where no registry is reachable, a base made from
# Debian's own packages serves for both (tests/image/image_test.sh: mmdebstrap | podman import):
#   --build-arg BASE_IMAGE=localhost/debian:12 --build-arg RUNTIME_BASE_IMAGE=localhost/debian:12
ARG BASE_IMAGE=debian:12
ARG RUNTIME_BASE_IMAGE=debian:12-slim

# ---- build: Debian 12 + setup.sh (+ CUDA toolkit) + the release preset --------------------------
FROM ${BASE_IMAGE} AS build
ARG WITH_CUDA
ARG CUDA_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# NVIDIA's CUDA repository for Debian 12 (the same packages a Debian developer machine installs):
# nvcc and the CUDA runtime headers, no driver (the host's driver is mounted at run time).
RUN if [[ "${WITH_CUDA}" == 1 ]]; then \
      apt-get update && \
      apt-get install -y --no-install-recommends ca-certificates curl && \
      curl -fsSL -o /tmp/cuda-keyring.deb \
        https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb && \
      dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb && \
      apt-get update && \
      apt-get install -y --no-install-recommends \
        "cuda-nvcc-${CUDA_VERSION/./-}" "cuda-cudart-dev-${CUDA_VERSION/./-}" && \
      { [[ -e /usr/local/cuda ]] || ln -s "/usr/local/cuda-${CUDA_VERSION}" /usr/local/cuda; } && \
      rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /src
# setup.sh first, alone, so the package layer is cached across source edits.
COPY deploy/setup.sh deploy/setup.sh
RUN ./deploy/setup.sh --no-python --no-image-tools && rm -rf /var/lib/apt/lists/*

COPY . .
# The README's preset; only what an image needs differs: portable code (no -march=native, the
# image runs on other CPUs than the builder's) and no tests or benchmarks.
RUN cmake --preset release -DATTNSERVE_NATIVE=OFF -DATTNSERVE_BUILD_TESTS=OFF \
      -DATTNSERVE_BUILD_BENCHMARKS=OFF && \
    cmake --build --preset release --target attnserve_server attnctl && \
    install -D -m 0755 build/release/server/attnserve_server /out/bin/attnserve_server && \
    install -D -m 0755 build/release/client/attnctl /out/bin/attnctl && \
    # The CUDA backend is a module the server loads at run time from next to its executable.
    if [ "${WITH_CUDA}" = "1" ]; then \
      cmake --build --preset release --target attnserve_cuda_plugin && \
      install -D -m 0644 build/release/kernels/cuda/libattnserve_cuda.so \
        /out/bin/libattnserve_cuda.so; \
    fi

# ---- runtime: Debian 12 slim + the shared libraries of setup.sh --runtime-only (+ CUDA runtime) --
FROM ${RUNTIME_BASE_IMAGE} AS runtime
ARG WITH_CUDA
ARG CUDA_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

COPY deploy/setup.sh /opt/attnserve/deploy/setup.sh
RUN /opt/attnserve/deploy/setup.sh --runtime-only && \
    if [[ "${WITH_CUDA}" == 1 ]]; then \
      apt-get install -y --no-install-recommends ca-certificates curl && \
      curl -fsSL -o /tmp/cuda-keyring.deb \
        https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb && \
      dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb && \
      apt-get update && \
      apt-get install -y --no-install-recommends "cuda-cudart-${CUDA_VERSION/./-}" && \
      apt-get purge -y curl && apt-get autoremove -y; \
    fi && \
    rm -rf /var/lib/apt/lists/*

# What the NVIDIA Container Toolkit reads to mount the host driver (as nvidia/cuda images set).
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

COPY --from=build /out/bin/ /usr/local/bin/
COPY deploy/healthcheck.sh /usr/local/bin/attnserve-healthcheck

RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin attnserve
USER attnserve:attnserve

# 50051: gRPC API; 9464: Prometheus metrics (/metrics). Both set by the CMD flags below.
EXPOSE 50051 9464

HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
  CMD ["attnserve-healthcheck"]

# SIGTERM drains in-flight calls for up to --shutdown_grace (default 10 s, as long as docker stop's
# default wait before SIGKILL: give it more, `docker stop -t 30`, as compose's stop_grace_period).
STOPSIGNAL SIGTERM
# --port_file in the ENTRYPOINT, not the CMD, so that a command's own flags keep it: the health
# check reads the bound port there (deploy/healthcheck.sh; /tmp, where the non-root user writes).
ENTRYPOINT ["attnserve_server", "--port_file=/tmp/attnserve.port"]
CMD ["--listen=0.0.0.0:50051", "--metrics_address=0.0.0.0:9464"]
