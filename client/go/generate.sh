#!/bin/sh
# Generates the Go protobuf messages and gRPC stubs of the wire contract (proto/gradserve/v1)
# into client/go/gradserve/v1 (package gradservev1), or into MODULE_DIR/gradserve/v1 for a
# copy of this module. Never committed; `go generate` in this folder runs it.
#
#   client/go/generate.sh [MODULE_DIR]
#
# Uses Debian's protoc (protobuf-compiler), protoc-gen-go (1.28) and protoc-gen-go-grpc;
# exits 1 naming the missing tool.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
proto_root=${GRADSERVE_PROTO_ROOT:-$(cd "$here/../../proto" && pwd)}
protoc=${PROTOC:-protoc}
for tool in "$protoc" protoc-gen-go protoc-gen-go-grpc; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "$0: $tool not found; apt-get install protobuf-compiler protoc-gen-go protoc-gen-go-grpc" >&2
    exit 1
  }
done
mkdir -p "$out"
"$protoc" -I "$proto_root" \
  --go_out="$out" --go_opt=paths=source_relative \
  --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
  gradserve/v1/tensor.proto gradserve/v1/graph.proto gradserve/v1/gradserve.proto
