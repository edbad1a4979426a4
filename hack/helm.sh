#!/usr/bin/env bash
# Builds the Helm CLI the chart tests use into bin/tools/helm-<version>, from the
# Go module proxy (the only registry these machines reach), with its own module
# cache entry so kvnet's go.mod is never touched. Skips the build when present.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.22.0}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/bin/tools
bin=$out/helm-$HELM_VERSION
if [ ! -x "$bin" ]; then
  echo "building helm $HELM_VERSION (first time only)" >&2
  mkdir -p "$out"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # go install pkg@version ignores the current module; running it from an
  # empty directory makes that explicit.
  (cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
  mv "$tmp/helm" "$bin"
fi
ln -sf "helm-$HELM_VERSION" "$out/helm"
echo "$out/helm"
