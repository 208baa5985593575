#!/bin/sh
# Writes a Go workspace that builds the gradserve Go client offline from Debian's packages.
#
#   client/go/offline.sh WORKDIR MODULE_DIR...
#   GOWORK=WORKDIR/go.work GOPROXY=off GOSUMDB=off go test ./...
#
# WORKDIR/go.work uses the given module folders (the client, examples/go) and replaces every
# module they need by Debian's source in /usr/share/gocode/src (golang-google-grpc-dev,
# golang-google-protobuf-dev, golang-github-golang-protobuf-1-5-dev and what they pull in).
# Modules that grpc's go.mod names but no Go file here imports, and that Debian does not ship,
# are replaced by empty stub modules under WORKDIR/stubs (a go.mod only), so that no module
# proxy is ever asked (/work/shared/RECIPES.md, "Go clients"). go.mod stays a normal module for
# online users; this workspace is used only offline.
#
# Exits 1 naming the missing package if Debian's Go sources are not installed.
set -eu

if [ $# -lt 2 ]; then
  echo "usage: $0 WORKDIR MODULE_DIR..." >&2
  exit 2
fi
work=$1
shift
gocode=${GOCODE:-/usr/share/gocode/src}
for m in google.golang.org/grpc google.golang.org/protobuf github.com/golang/protobuf; do
  [ -f "$gocode/$m/go.mod" ] || {
    echo "$0: $gocode/$m missing; apt-get install golang-google-grpc-dev" \
      "golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev" >&2
    exit 1
  }
done

mkdir -p "$work/stubs"
work=$(cd "$work" && pwd)
{
  echo "go 1.19"
  echo
  for dir in "$@"; do
    echo "use $(cd "$dir" && pwd)"
  done
  echo
  # Debian's sources.
  for m in google.golang.org/grpc google.golang.org/protobuf github.com/golang/protobuf \
           golang.org/x/net golang.org/x/sys golang.org/x/text google.golang.org/genproto \
           github.com/google/go-cmp golang.org/x/oauth2; do
    if [ -f "$gocode/$m/go.mod" ]; then
      echo "replace $m => $gocode/$m"
    else
      stub=$work/stubs/$m
      mkdir -p "$stub"
      echo "module $m" > "$stub/go.mod"
      echo "replace $m => $stub"
    fi
  done
  # Named in go.mod files, never imported here, not shipped by Debian (or shipped without a
  # go.mod): empty modules.
  for m in github.com/cncf/udpa/go github.com/envoyproxy/go-control-plane \
           github.com/golang/glog github.com/google/uuid golang.org/x/term \
           cloud.google.com/go/compute/metadata cloud.google.com/go/compute \
           google.golang.org/appengine golang.org/x/lint golang.org/x/tools \
           honnef.co/go/tools golang.org/x/mod; do
    stub=$work/stubs/$m
    mkdir -p "$stub"
    echo "module $m" > "$stub/go.mod"
    echo "replace $m => $stub"
  done
} > "$work/go.work"
