#!/usr/bin/env bash
# Checks the README's promise that `make demo` and `make test` work on a fresh
# machine with only Go, and times them cold: clones this checkout's HEAD into a
# temporary folder and runs the make targets there with an empty GOCACHE, an
# empty GOMODCACHE and no bin/ (so kube-apiserver, etcd, helm, prometheus and
# kvnet are all built from source), printing how long each took.
#
#   hack/fresh-machine.sh                 # make demo, then make test (40+ min on 2 cores)
#   hack/fresh-machine.sh prometheus      # any other targets, in order (e.g. to try the tool builds)
#   hack/fresh-machine.sh --keep ...      # keep the clone, caches and logs afterwards
#
# Only committed work is checked (it is a clone). As in CI, a copy of
# ../shared (KubeVirt's binaries for `make kubevirt`) lies beside the clone.
# The timings depend on what else runs: it prints the load before and after.
set -euo pipefail

keep=
if [ "${1:-}" = --keep ]; then keep=1; shift; fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(demo test)

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvnet-fresh.XXXXXX")
status=0
# A failed run keeps everything for a look; a passed one keeps it on --keep.
cleanup() { if [ -z "$keep" ] && [ "$status" = 0 ]; then rm -rf "$work"; else echo "kept: $work (rm -rf it when done)"; fi; }
trap cleanup EXIT

git clone --quiet --no-local "$root" "$work/kvnet"
shared=$root/../shared
if [ -d "$shared" ]; then ln -s "$(cd "$shared" && pwd)" "$work/shared"; fi
mkdir -p "$work/gocache" "$work/gomodcache" "$work/logs"

# The variables through which a developer's machine points kvnet at tools
# already built, or at other caches, are dropped; the module cache is made
# writable so that it can be removed afterwards.
run_env=(env -u KUBEBUILDER_ASSETS -u KVNET_ASSETS -u KVNET_PROMETHEUS_DIR -u HELM
  -u KUBEVIRT_SRC -u KUBEVIRT_SHARED
  GOCACHE="$work/gocache" GOMODCACHE="$work/gomodcache" GOFLAGS=-modcacherw)

duration() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

echo "fresh-machine check of $(git -C "$work/kvnet" log -1 --format='%h %s')"
echo "in $work ($(go version | cut -d' ' -f3), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
results=()
for t in "${targets[@]}"; do
  echo "== make $t (log: $work/logs/$t.log)"
  start=$(date +%s)
  if (cd "$work/kvnet" && "${run_env[@]}" make "$t") 2>&1 | tee "$work/logs/$t.log"; then
    result=ok
  else
    result=FAILED status=1
  fi
  took=$(($(date +%s) - start))
  results+=("make $t: $result in $(duration "$took")")
  echo "${results[-1]}"
  [ "$result" = ok ] || break
done
echo "== summary (load $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%s\n' "${results[@]}"
exit "$status"
