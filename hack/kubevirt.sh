#!/usr/bin/env bash
# Puts KubeVirt's own virt-controller and virt-api (static linux binaries) into
# bin/kubevirt/<version>/, where the real-KubeVirt test tier looks for them.
#
# Sources, in order:
#   1. bin/kubevirt/<version>/ already holds both binaries: nothing to do;
#   2. KUBEVIRT_SHARED (default ../shared/kubevirt/<version> beside this
#      checkout): the gzipped binaries there, checked against its SHA256SUMS;
#   3. KUBEVIRT_SRC, a KubeVirt source tree at that tag, or else a shallow
#      clone of the tag (only where the network reaches GitHub): built with
#      KubeVirt's vendored modules, exactly as the shared copies were.
#      KUBEVIRT_NO_BUILD=1 stops before this source: `make demo` uses it to
#      take the binaries when they are at hand, never to start a build.
# Fails with a message saying how to get them; it never skips.
set -euo pipefail

KUBEVIRT_VERSION=${KUBEVIRT_VERSION:-v1.9.0}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/bin/kubevirt/$KUBEVIRT_VERSION
shared=${KUBEVIRT_SHARED:-$root/../shared/kubevirt/$KUBEVIRT_VERSION}
bins=(virt-controller virt-api)

have_all() { for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done; }
have_all && { echo "$out"; exit 0; }
mkdir -p "$out"

if [ -f "$shared/SHA256SUMS" ] && [ -f "$shared/bin/virt-api.gz" ]; then
  echo "unpacking KubeVirt $KUBEVIRT_VERSION binaries from $shared" >&2
  for b in "${bins[@]}"; do
    want=$(awk -v f="bin/$b" '$2 == f {print $1}' "$shared/SHA256SUMS")
    [ -n "$want" ] || { echo "hack/kubevirt.sh: $shared/SHA256SUMS has no line for bin/$b" >&2; exit 1; }
    gunzip -c "$shared/bin/$b.gz" > "$out/$b.tmp"
    got=$(sha256sum "$out/$b.tmp" | cut -d' ' -f1)
    if [ "$got" != "$want" ]; then
      rm -f "$out/$b.tmp"
      echo "hack/kubevirt.sh: $b from $shared has sha256 $got, SHA256SUMS says $want" >&2
      exit 1
    fi
    chmod 755 "$out/$b.tmp" && mv "$out/$b.tmp" "$out/$b"
  done
  echo "$out"
  exit 0
fi

src=${KUBEVIRT_SRC:-}
if [ "${KUBEVIRT_NO_BUILD:-}" = 1 ]; then
  echo "hack/kubevirt.sh: no $shared and KUBEVIRT_NO_BUILD=1: not building KubeVirt $KUBEVIRT_VERSION" >&2
  exit 1
fi
if [ -z "$src" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "no $shared; cloning kubevirt $KUBEVIRT_VERSION (needs access to github.com)" >&2
  if ! git clone -q --depth 1 --branch "$KUBEVIRT_VERSION" https://github.com/kubevirt/kubevirt "$tmp/kubevirt"; then
    cat >&2 <<MSG
hack/kubevirt.sh: cannot get KubeVirt $KUBEVIRT_VERSION's virt-controller and virt-api.
Provide one of:
  - KUBEVIRT_SHARED=<dir> holding bin/virt-controller.gz, bin/virt-api.gz and SHA256SUMS
    (default: $shared);
  - KUBEVIRT_SRC=<kubevirt source tree checked out at $KUBEVIRT_VERSION>;
  - network access to github.com for a clone of the tag.
MSG
    exit 1
  fi
  src=$tmp/kubevirt
fi
echo "building virt-controller and virt-api from $src" >&2
(cd "$src" && CGO_ENABLED=0 go build -mod=vendor -trimpath -ldflags='-s -w' -o "$out/" ./cmd/virt-controller ./cmd/virt-api)
have_all || { echo "hack/kubevirt.sh: build in $src did not produce ${bins[*]}" >&2; exit 1; }
echo "$out"
