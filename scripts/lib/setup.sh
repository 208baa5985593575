# Shared set-up for scripts/serve and scripts/test: source it, do not run it.
#
# gradserve_install_packages [PACKAGE...]
#                             installs the Debian packages gradserve needs that are missing,
#                             and those named (as root with apt-get; otherwise prints the
#                             command, returns 1), then Node.js if no `node`/`npm` is on the
#                             PATH (optional: only the Node.js example test needs it, and it
#                             skips without).
# gradserve_build PRESET      configures and builds one CMake preset (CMakePresets.json) into
#                             build/PRESET.

GRADSERVE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

GRADSERVE_PACKAGES=(
  cmake ninja-build g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev libmimalloc-dev libcpp-httplib-dev
  # PrometheusTest (tests/server/service/metrics_test.cc) scrapes a real server with Prometheus.
  prometheus
  python3-torch python3-numpy python3-grpcio python3-protobuf openssl
  # `pip install client/python` offline (ctest python_package): Debian's pip, setuptools, venv.
  python3-pip python3-setuptools python3-venv
  # `gradserve graph --format=svg|png` pipes its DOT through Graphviz's dot.
  graphviz
  # The Python package's type check (ctest python_types): mypy over client/python/gradserve.
  mypy
  # The Go client (client/go, ctest go_client), built offline from Debian's Go sources. Name
  # the -1-5-dev package: without it apt picks golang/protobuf 1.3 (shared/RECIPES.md).
  golang-go golang-google-grpc-dev golang-google-protobuf-dev
  golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc
  # The Java client (client/java, ctest java_client), built with javac from Debian's jars;
  # libgrpc-java's dependencies are incomplete, hence the netty, perfmark and annotation jars.
  default-jdk-headless libgrpc-java libprotobuf-java protobuf-compiler-grpc-java-plugin junit5
  libnetty-java libperfmark-java libgoogle-gson-java libanimal-sniffer-java
  libgoogle-common-protos-java libgeronimo-annotation-1.3-spec-java
)
# What the asan preset (scripts/test's sanitized suite, scripts/fuzz) needs besides: clang 14
# with its sanitizer runtimes and libFuzzer (RECIPES.md).
GRADSERVE_FUZZ_PACKAGES=(clang-14 libclang-rt-14-dev libfuzzer-14-dev)
# Node.js may come from elsewhere (NodeSource ships npm inside its nodejs package, which
# conflicts with Debian's npm), so it is installed only when the commands are missing.
GRADSERVE_OPTIONAL_PACKAGES=(nodejs npm)

gradserve_install_packages() {
  local missing=() p
  for p in "${GRADSERVE_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "gradserve: installing missing Debian packages: ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
      echo "gradserve: not root; run this first:" >&2
      echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
      return 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then
      echo "gradserve: installing Node.js (optional: ${GRADSERVE_OPTIONAL_PACKAGES[*]})"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${GRADSERVE_OPTIONAL_PACKAGES[@]}" \
        >/dev/null || echo "gradserve: Node.js could not be installed; its example test will be skipped" >&2
    else
      echo "gradserve: no Node.js; its example test will be skipped" >&2
    fi
  fi
  return 0
}

gradserve_build() {
  local preset="$1"
  (cd "$GRADSERVE_ROOT" && cmake --preset "$preset" >/dev/null &&
    cmake --build "build/$preset" --parallel "$(nproc)")
}
