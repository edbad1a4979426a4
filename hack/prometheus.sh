#!/usr/bin/env bash
# Builds the prometheus and promtool the monitoring tests run (test/chart's
# alert unit tests, test/monitoring's real Prometheus) into
# bin/tools/prometheus-<version>/, from the github.com/prometheus/prometheus Go
# module, so `make test` needs only Go. Skips the build when both are there.
#
# Prometheus v3.X.Y is the Go module version v0.3XX.Y. Its go.mod has no
# replace directives, so `go install pkg@version` builds it as released.
# Built without the web UI assets (no `builtinassets` tag; the HTTP API, rule
# evaluation and /-/ready work without them) and without the service
# discovery plugins (`remove_all_sd`: the tests scrape a static target), so
# most cloud SDKs are neither downloaded nor compiled. A prometheus and promtool on PATH of exactly this version
# are linked instead of built.
set -euo pipefail

PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v3.16.0}
root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/bin/tools
out=$tools/prometheus-$PROMETHEUS_VERSION
bins=(prometheus promtool)

have_all() { for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done; }

# `prometheus --version` prints "prometheus, version 3.16.0 (branch: ...".
system_same_version() {
  local b v
  for b in "${bins[@]}"; do
    command -v "$b" >/dev/null || return 1
    v=$("$b" --version 2>&1 | sed -n '1s/^[a-z]*, version \([^ ]*\).*/\1/p')
    if [ "v$v" != "$PROMETHEUS_VERSION" ]; then
      echo "the $b on PATH is version ${v:-unknown}, not $PROMETHEUS_VERSION: building $PROMETHEUS_VERSION" >&2
      return 1
    fi
  done
}

if ! have_all; then
  mkdir -p "$tools"
  tmp=$(mktemp -d "$tools/.prometheus-build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  if system_same_version; then
    for b in "${bins[@]}"; do ln -s "$(command -v "$b")" "$tmp/$b"; done
  else
    IFS=. read -r major minor patch <<<"${PROMETHEUS_VERSION#v}"
    [ "$major" = 3 ] || { echo "hack/prometheus.sh: only Prometheus v3.x maps to a Go module version (v0.3XX.Y), not $PROMETHEUS_VERSION" >&2; exit 1; }
    module=v0.$((300 + minor)).$patch
    echo "building prometheus and promtool $PROMETHEUS_VERSION (module $module; first time only, a few minutes cold)" >&2
    ld="-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}"
    # An empty directory: go install pkg@version ignores any current module,
    # and this makes it explicit.
    (cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath -tags remove_all_sd -ldflags "$ld" \
      "github.com/prometheus/prometheus/cmd/prometheus@$module" \
      "github.com/prometheus/prometheus/cmd/promtool@$module")
  fi
  # One rename, so a worktree sharing bin/tools never sees half a folder.
  chmod 755 "$tmp"
  mv -T "$tmp" "$out" 2>/dev/null || have_all || { echo "hack/prometheus.sh: could not move the build to $out" >&2; exit 1; }
fi
# The folder the tests use when KVNET_PROMETHEUS_DIR (set by the Makefile) is not.
ln -sfn "prometheus-$PROMETHEUS_VERSION" "$tools/prometheus"
echo "$out"
