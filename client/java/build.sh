#!/bin/sh
# Builds the gradserve Java client offline from Debian's packages into OUTDIR:
#
#   client/java/build.sh OUTDIR
#
# OUTDIR/generated   the protobuf messages and gRPC stubs of proto/ (protoc --java_out and
#                    grpc_java_plugin), never committed
# OUTDIR/gradserve-client.jar   the library (package dev.gradserve.client) with those stubs
# OUTDIR/classpath   the run-time class path: the jar and Debian's grpc-java, protobuf-java,
#                    guava, perfmark and netty jars from /usr/share/java
#
# Needs default-jdk, libgrpc-java, libprotobuf-java, protobuf-compiler-grpc-java-plugin and the
# jars libgrpc-java leaves out (libnetty-java, libperfmark-java, libgeronimo-annotation-1.3-
# spec-java for the stubs' @Generated). Exits 1 naming what is missing.
set -eu

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
proto_root=$(cd "$here/../../proto" && pwd)
java_dir=${GRADSERVE_JAVA_JARS:-/usr/share/java}
plugin=${GRPC_JAVA_PLUGIN:-$(command -v grpc_java_plugin || true)}
protoc=${PROTOC:-protoc}

runtime="grpc-api grpc-context grpc-core grpc-stub grpc-protobuf grpc-protobuf-lite grpc-netty
  protobuf guava failureaccess perfmark-api netty-codec-http2 netty-codec-http netty-codec
  netty-handler netty-transport netty-buffer netty-common netty-resolver"
classpath=""
for jar in $runtime; do
  if [ -f "$java_dir/$jar.jar" ]; then
    classpath="$classpath:$java_dir/$jar.jar"
  elif [ "$jar" != failureaccess ]; then
    echo "$0: $java_dir/$jar.jar missing; apt-get install libgrpc-java libprotobuf-java libnetty-java libperfmark-java" >&2
    exit 1
  fi
done
classpath=${classpath#:}
annotations=$java_dir/geronimo-annotation-1.3-spec.jar
for tool in javac jar "$protoc"; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$0: $tool not found; apt-get install default-jdk protobuf-compiler" >&2; exit 1; }
done
[ -n "$plugin" ] && [ -x "$plugin" ] || { echo "$0: grpc_java_plugin not found; apt-get install protobuf-compiler-grpc-java-plugin" >&2; exit 1; }
[ -f "$annotations" ] || { echo "$0: $annotations missing; apt-get install libgeronimo-annotation-1.3-spec-java" >&2; exit 1; }

mkdir -p "$1"
out=$(cd "$1" && pwd)
rm -rf "$out/generated" "$out/classes"
mkdir -p "$out/generated" "$out/classes"
"$protoc" -I "$proto_root" --java_out="$out/generated" \
  --plugin=protoc-gen-grpc-java="$plugin" --grpc-java_out="$out/generated" \
  gradserve/v1/tensor.proto gradserve/v1/graph.proto gradserve/v1/gradserve.proto \
  grpc/health/v1/health.proto
find "$out/generated" "$here/src/main/java" -name '*.java' > "$out/sources"
javac -nowarn -encoding UTF-8 --release 11 -cp "$classpath:$annotations" -d "$out/classes" @"$out/sources"
jar --create --file "$out/gradserve-client.jar" -C "$out/classes" .
echo "$out/gradserve-client.jar:$classpath" > "$out/classpath"
