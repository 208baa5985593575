#!/bin/sh
# Generates the Python protobuf messages and gRPC stubs of the wire contract into OUTDIR.
#
#   client/python/generate.sh OUTDIR
#
# Uses Debian's protoc and grpc_python_plugin (packages protobuf-compiler and
# protobuf-compiler-grpc); the output is never committed. Afterwards point the client at it:
#
#   GRADSERVE_PY_STUBS=OUTDIR PYTHONPATH=client/python /usr/bin/python3 -c 'import gradserve'
#
# Layout of OUTDIR:
#   gradserve/v1/{tensor,graph,gradserve}_pb2.py, gradserve_pb2_grpc.py
#       found by the client package as gradserve.v1.* (it extends its own __path__)
#   health/grpc/health/v1/health_pb2.py
#       the standard health protocol's messages, kept apart because their module path would
#       otherwise shadow the grpc package itself; the client loads this file by path.
#
# Exits non-zero, naming the missing tool, if protoc or the plugin cannot be found.
set -eu

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
out=$1
here=$(cd "$(dirname "$0")" && pwd)
proto_root=$(cd "$here/../../proto" && pwd)
protoc=${PROTOC:-protoc}
plugin=${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || true)}

command -v "$protoc" >/dev/null 2>&1 || { echo "$0: protoc not found" >&2; exit 1; }
[ -n "$plugin" ] && [ -x "$plugin" ] || { echo "$0: grpc_python_plugin not found" >&2; exit 1; }

mkdir -p "$out/health"
"$protoc" -I "$proto_root" \
  --python_out="$out" --grpc_out="$out" --plugin=protoc-gen-grpc="$plugin" \
  gradserve/v1/tensor.proto gradserve/v1/graph.proto gradserve/v1/gradserve.proto
"$protoc" -I "$proto_root" --python_out="$out/health" grpc/health/v1/health.proto
