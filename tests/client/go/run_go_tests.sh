#!/bin/sh
# Runs the Go client's tests (client/go, with examples/go) offline against a real
# gradserve-server: the ctest `go_client`.
#
#   GRADSERVE_SERVER=build/release/server/gradserve-server tests/client/go/run_go_tests.sh WORKDIR
#
# Copies client/go, examples/go and the conformance cases (tests/conformance) into WORKDIR (the source tree stays clean), generates the
# protobuf code there (client/go/generate.sh), writes an offline Go workspace over Debian's Go
# sources (client/go/offline.sh) and runs `go vet` and `go test` with no module proxy.
# Exits 77 (ctest's SKIP_RETURN_CODE), saying what to install, when Go, the generators or
# Debian's Go sources are missing.
set -eu

if [ $# -ne 1 ]; then
  echo "usage: $0 WORKDIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
packages="golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc"
for tool in go protoc-gen-go protoc-gen-go-grpc; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool not found; apt-get install --no-install-recommends $packages"
    exit 77
  fi
done
if [ ! -f /usr/share/gocode/src/google.golang.org/grpc/go.mod ] ||
   [ ! -f /usr/share/gocode/src/github.com/golang/protobuf/go.mod ]; then
  echo "SKIP: Debian's Go sources of grpc/protobuf missing; apt-get install --no-install-recommends $packages"
  exit 77
fi

work=$1
rm -rf "$work/src"
mkdir -p "$work/src/client" "$work/src/examples" "$work/src/tests"
work=$(cd "$work" && pwd)
cp -R "$repo/client/go" "$work/src/client/go"
cp -R "$repo/examples/go" "$work/src/examples/go"
cp -R "$repo/tests/conformance" "$work/src/tests/conformance"
rm -rf "$work/src/client/go/gradserve"
GRADSERVE_PROTO_ROOT="$repo/proto" sh "$work/src/client/go/generate.sh" "$work/src/client/go"
sh "$repo/client/go/offline.sh" "$work" "$work/src/client/go" "$work/src/examples/go"

export GOWORK="$work/go.work" GOPROXY=off GOSUMDB=off GOFLAGS= GOPATH="$work/gopath"
[ -n "${HOME:-}" ] && [ -w "${HOME:-/nonexistent}" ] || export GOCACHE="$work/gocache"
cd "$work/src/client/go"
go vet . ../../examples/go
exec go test -count=1 -v .
