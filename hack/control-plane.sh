#!/usr/bin/env bash
# Builds a real kube-apiserver and etcd from Go modules into bin/k8s/<version>/,
# the folder KUBEBUILDER_ASSETS points at. setup-envtest's download cannot work on
# machines that only reach the Go module proxy, so we compile the same binaries.
# Skips the build when the versioned binaries are already there.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${KVNET_ASSETS:-$root/bin/k8s/$K8S_VERSION}
mkdir -p "$out"

staging=${K8S_VERSION/v1./v0.}   # k8s.io/api etc. are tagged v0.<minor>.<patch>
major=1
minor=$(echo "$K8S_VERSION" | cut -d. -f2)

build_apiserver() {
  [ -x "$out/kube-apiserver" ] && return 0
  echo "building kube-apiserver $K8S_VERSION (a cold build takes several minutes)" >&2
  local tmp; tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  (
    cd "$tmp"
    go mod init kvnet.local/control-plane >/dev/null 2>&1
    go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
    gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    # Every staging module k8s.io/kubernetes requires at v0.0.0 must be replaced
    # by its published tag, exactly as k8s.io/kubernetes' own replace block does.
    for m in $(go mod edit -json "$gomod" | awk '/"Path": "k8s.io\//{p=$2} /"Version": "v0.0.0"/{gsub(/[",]/,"",p); print p}'); do
      go mod edit -replace "$m=$m@$staging"
    done
    go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" >/dev/null
    ld="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    done
    CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$out/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
    mv "$out/kube-apiserver.tmp" "$out/kube-apiserver"
  )
}

build_etcd() {
  [ -x "$out/etcd" ] && return 0
  echo "building etcd $ETCD_VERSION" >&2
  local tmp; tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  (
    cd "$tmp"
    go mod init kvnet.local/etcd >/dev/null 2>&1
    go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3
    mv "$out/etcd.tmp" "$out/etcd"
  )
}

build_apiserver
build_etcd
echo "$out"
