#!/usr/bin/env bash
# Renders every kustomize overlay of deploy/k8s and checks every object it makes, offline
# (no cluster): `kubectl kustomize` must render it, each object must match the Kubernetes 1.30
# API schema with no unknown field (a misspelt `periodSecond` or `runAsNonroot` fails), and
# gradserve's own rules must hold (restricted Pod Security Standard, requests = limits, no
# :latest, no replicas beside the HPA, probes, grace periods; validate/validate.js).
#
# Usage: deploy/k8s/validate.sh [--k8s-dir DIR] [--out DIR]
#   --k8s-dir DIR   the folder holding overlays/ (default: this script's folder)
#   --out DIR       also keep the rendered overlays there, one OVERLAY.yaml each
# Needs kubectl (for `kubectl kustomize`), node, and the checker's npm packages:
#   npm ci --prefix deploy/k8s/validate
# (scripts/test runs that). Exit status: 0 all good, 1 a render or a check failed, 2 bad
# usage or a tool missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
k8s_dir="$here"
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --k8s-dir) k8s_dir="${2:?--k8s-dir needs a folder}"; shift 2 ;;
    --k8s-dir=*) k8s_dir="${1#*=}"; shift ;;
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    --out=*) out="${1#*=}"; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "validate.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

missing() { echo "validate.sh: $1" >&2; exit 2; }
command -v kubectl >/dev/null || missing "kubectl not found (it renders the overlays: kubectl kustomize)"
command -v node >/dev/null || missing "node not found: apt-get install nodejs npm"
[ -d "$here/validate/node_modules/typescript" ] && [ -d "$here/validate/node_modules/kubernetes-types" ] ||
  missing "the checker's packages are not installed: npm ci --prefix deploy/k8s/validate"

shopt -s nullglob
overlays=("$k8s_dir"/overlays/*/)
[ ${#overlays[@]} -gt 0 ] || missing "no overlays in $k8s_dir/overlays"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
rendered=()
status=0
for dir in "${overlays[@]}"; do
  name="$(basename "$dir")"
  if kubectl kustomize "$dir" > "$tmp/$name.yaml" 2> "$tmp/$name.err"; then
    echo "rendered overlays/$name: $(grep -c '^kind: ' "$tmp/$name.yaml") objects"
    rendered+=("$tmp/$name.yaml")
  else
    echo "FAIL $name: kubectl kustomize overlays/$name:"
    sed 's/^/  /' "$tmp/$name.err"
    status=1
  fi
done
if [ -n "$out" ]; then
  mkdir -p "$out"
  for f in "${rendered[@]}"; do cp "$f" "$out/"; done
fi
if [ ${#rendered[@]} -gt 0 ]; then
  node "$here/validate/validate.js" "${rendered[@]}" || status=1
fi
if [ "$status" -eq 0 ]; then
  echo "validate.sh: every overlay renders and passes"
else
  echo "validate.sh: FAILED" >&2
fi
exit "$status"
