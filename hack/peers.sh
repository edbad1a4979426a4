#!/usr/bin/env bash
# Puts the peers' binaries that the Go module proxy does not serve
# (ipam-extensions edb24de and kubemacpool v0.51.1) into
# bin/tools/peers/, where test/e2e runs them beside kvnet. Skips what is
# there.
#
# Source: PEERS_SHARED (default ../shared/peers beside this checkout, or
# beside KUBEVIRT_SHARED's shared folder when only that is set), holding
# bin/<name>.gz and SHA256SUMS of the uncompressed binaries. Each binary is
# checked against its sum before it is moved into place; a mismatch fails.
# network-resources-injector is served by the module proxy: hack/nri.sh
# builds it.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/bin/tools/peers
default=$root/../shared/peers
if [ -n "${KUBEVIRT_SHARED:-}" ]; then
  default=$KUBEVIRT_SHARED/../../peers
fi
shared=${PEERS_SHARED:-$default}
bins=(ipam-extensions kubemacpool)

have_all() { for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done; }
have_all && { echo "$out"; exit 0; }

if [ ! -f "$shared/SHA256SUMS" ]; then
  echo "hack/peers.sh: no $shared/SHA256SUMS: set PEERS_SHARED to a folder holding bin/ipam-extensions.gz, bin/kubemacpool.gz and SHA256SUMS" >&2
  exit 1
fi
mkdir -p "$out"
echo "unpacking ipam-extensions and kubemacpool from $shared" >&2
for b in "${bins[@]}"; do
  [ -x "$out/$b" ] && continue
  want=$(awk -v f="bin/$b" '$2 == f {print $1}' "$shared/SHA256SUMS")
  [ -n "$want" ] || { echo "hack/peers.sh: $shared/SHA256SUMS has no line for bin/$b" >&2; exit 1; }
  tmp=$(mktemp "$out/.$b.XXXXXX")
  gunzip -c "$shared/bin/$b.gz" > "$tmp"
  got=$(sha256sum "$tmp" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    rm -f "$tmp"
    echo "hack/peers.sh: $b from $shared has sha256 $got, SHA256SUMS says $want" >&2
    exit 1
  fi
  # One rename, so a worktree sharing bin/tools never runs half a binary.
  chmod 755 "$tmp" && mv -f "$tmp" "$out/$b"
done
echo "$out"
