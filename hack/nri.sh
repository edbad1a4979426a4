#!/usr/bin/env bash
# Builds network-resources-injector's webhook (test/e2e runs it beside
# kvnet) into bin/tools/nri-<version>/, from the
# github.com/k8snetworkplumbingwg/network-resources-injector Go module, so
# `make test` needs only Go. Skips the build when it is there.
#
# The folder also gets the project's deployments/ (its RBAC, Deployment and
# webhook configuration) from the same module, so the tests deploy it with
# what the project ships rather than a copy of ours.
#
# `go install pkg@version` would be the short way, but for this module the
# proxy answers 403 on the version list it reads for deprecation notices;
# `go mod download` of the exact version works, and the module's own go.mod
# and go.sum (no replace directives) pin what is built.
set -euo pipefail

NRI_VERSION=${NRI_VERSION:-v1.9.0}
module=github.com/k8snetworkplumbingwg/network-resources-injector
root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/bin/tools
out=$tools/nri-$NRI_VERSION

have_all() { [ -x "$out/webhook" ] && [ -f "$out/deployments/auth.yaml" ]; }

if ! have_all; then
  mkdir -p "$tools"
  tmp=$(mktemp -d "$tools/.nri-build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "building network-resources-injector $NRI_VERSION (first time only, about a minute cold)" >&2
  # Outside any module, so kvnet's go.mod plays no part.
  src=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "$module@$NRI_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$src" ] || { echo "hack/nri.sh: go mod download $module@$NRI_VERSION gave no source folder" >&2; exit 1; }
  # Static: test/e2e runs it in a chroot holding only itself and its files.
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$tmp/webhook" ./cmd/webhook)
  mkdir "$tmp/deployments"
  cp "$src"/deployments/*.yaml "$tmp/deployments/"
  chmod -R u+w "$tmp"
  chmod 755 "$tmp"
  # One rename, so a worktree sharing bin/tools never sees half a folder.
  mv -T "$tmp" "$out" 2>/dev/null || have_all || { echo "hack/nri.sh: could not move the build to $out" >&2; exit 1; }
fi
echo "$out"
