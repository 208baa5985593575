#!/bin/sh
# Builds the Java client (client/java/build.sh) and its example (examples/java) offline from
# Debian's jars into WORKDIR and runs its JUnit 5 tests against real gradserve-server
# processes: the ctest `java_client`.
#
#   GRADSERVE_SERVER=build/release/server/gradserve-server tests/client/java/run_java_tests.sh WORKDIR
#
# Exits 77 (ctest's SKIP_RETURN_CODE), saying what to install, without a JDK, Debian's
# grpc-java jars, the gRPC Java protoc plugin or JUnit 5.
set -eu

if [ $# -ne 1 ]; then
  echo "usage: $0 WORKDIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
java_dir=${GRADSERVE_JAVA_JARS:-/usr/share/java}
junit=$java_dir/junit-platform-console-standalone.jar
packages="default-jdk-headless libgrpc-java libprotobuf-java protobuf-compiler-grpc-java-plugin junit5 libnetty-java libperfmark-java libgeronimo-annotation-1.3-spec-java"
for tool in javac java jar grpc_java_plugin; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool not found; apt-get install --no-install-recommends $packages"
    exit 77
  fi
done
for jar in grpc-netty grpc-stub protobuf protobuf-util gson netty-codec-http2 perfmark-api geronimo-annotation-1.3-spec; do
  if [ ! -f "$java_dir/$jar.jar" ]; then
    echo "SKIP: $java_dir/$jar.jar missing; apt-get install --no-install-recommends $packages"
    exit 77
  fi
done
if [ ! -f "$junit" ]; then
  echo "SKIP: $junit missing; apt-get install --no-install-recommends junit5"
  exit 77
fi

mkdir -p "$1"
work=$(cd "$1" && pwd)
sh "$repo/client/java/build.sh" "$work"
classpath=$(cat "$work/classpath")
rm -rf "$work/test-classes" "$work/example"
mkdir -p "$work/test-classes" "$work/example"
javac -nowarn -encoding UTF-8 -cp "$classpath" -d "$work/example" "$repo/examples/java/Example.java"
find "$repo/client/java/src/test/java" -name '*.java' > "$work/test-sources"
# The conformance test parses JSON with protobuf-util's JsonFormat, which needs gson.
test_classpath="$classpath:$java_dir/protobuf-util.jar:$java_dir/gson.jar"
javac -nowarn -encoding UTF-8 -cp "$test_classpath:$junit" -d "$work/test-classes" @"$work/test-sources"
exec java "-Dgradserve.example.classpath=$work/example:$classpath" \
  "-Dgradserve.conformance.dir=$repo/tests/conformance" -jar "$junit" \
  --class-path "$work/test-classes:$test_classpath" --select-package dev.gradserve.client \
  --disable-banner --disable-ansi-colors --details=tree --fail-if-no-tests
