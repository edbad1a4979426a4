# kvnet: the two commands that matter are `make demo` (the main job) and
# `make test` (everything CI runs). See README.md.
SHELL := /usr/bin/env bash
K8S_VERSION ?= v1.37.2
ASSETS := $(CURDIR)/bin/k8s/$(K8S_VERSION)
export KUBEBUILDER_ASSETS ?= $(ASSETS)
GO ?= go

.PHONY: all build loadtest docs demo demo-down demo-offline test race unit integration lint control-plane kubevirt bench bench-proxy fuzz helm helm-lint
.PHONY: prometheus nri peers

# The version comes from the chart's appVersion, so the binary's `kvnet
# version`, the image tag and the chart's default image are one number.
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' charts/kvnet/Chart.yaml)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/kvnet/kvnet/internal/version.Version=$(VERSION) -X github.com/kvnet/kvnet/internal/version.Commit=$(COMMIT)

.PHONY: image image-ref

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kvnet ./cmd/kvnet

# The admission load tool (hack/loadtest), kept out of the kvnet binary.
loadtest:
	$(GO) build -o bin/kvnet-loadtest ./hack/loadtest

# The generated reference pages (docs/cli.md, docs/metrics.md,
# docs/helm-values.md and docs/config.md's key table), from the code and
# values they describe (hack/docs/pages); test/docs fails when one is stale.
docs:
	$(GO) run ./hack/docs .

# The container image, without a Docker engine: a static kvnet per platform
# and hack/image (go-containerregistry) writing them as one OCI image index
# in an OCI layout at $(IMAGE_LAYOUT). Publish with
#   crane push $(IMAGE_LAYOUT) <ref>   or   skopeo copy --all oci:$(IMAGE_LAYOUT):$(VERSION) docker://<ref>
# The Dockerfile builds the same image for those who use Docker.
IMAGE_REPO ?= ghcr.io/kvnet/kvnet
IMAGE := $(IMAGE_REPO):$(VERSION)
PLATFORMS ?= linux/amd64 linux/arm64
IMAGE_LAYOUT ?= bin/image
IMAGE_BUILD ?= bin/image-build
# -trimpath keeps build paths out of the binary, so a commit always gives the same digest.
IMAGE_GOFLAGS ?= -trimpath
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
image:
	@set -e; bins=; for p in $(PLATFORMS); do \
		IFS=/ read -r os arch variant <<<"$$p"; out=$(IMAGE_BUILD)/$$os-$$arch$$variant/kvnet; \
		echo "building $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch GOARM=$${variant#v} $(GO) build $(IMAGE_GOFLAGS) \
			-ldflags '-s -w $(LDFLAGS)' -o $$out ./cmd/kvnet; \
		bins="$$bins --binary $$p=$$out"; \
	done; \
	$(GO) run ./hack/image --layout $(IMAGE_LAYOUT) --ref $(IMAGE) --version $(VERSION) \
		--commit $(COMMIT) --created $(SOURCE_DATE_EPOCH) $$bins

# Prints the image reference `make image` names (test/chart checks the chart's default is the same).
image-ref:
	@echo $(IMAGE)

# The main job without a cluster: every example VM through kvnet's webhook code.
demo-offline: build
	./bin/kvnet mutate -f examples/vms.yaml --nads examples/nads.yaml --nads examples/namespaces.yaml \
		--config examples/config.yaml --kubevirt examples/kubevirt.yaml

# The main job: a local kube-apiserver + etcd, kvnet running against it with
# self-managed certificates and its webhooks registered for real, examples/
# applied, and what kvnet changed or refused printed per VM; then, with
# KubeVirt's virt-controller and virt-api (make kubevirt), a VM's launcher
# pod and IPAMClaim, a virt-handler's migration0 address, a stop/start and
# refusals. KubeVirt is taken only when at hand (unpacked from ../shared,
# never built here); without it the demo says what it leaves out. Exits when
# done; `make demo KEEP=1` keeps everything running until Ctrl-C or `make demo-down`.
demo: build control-plane
	@KUBEVIRT_VERSION=$(KUBEVIRT_VERSION) KUBEVIRT_NO_BUILD=1 hack/kubevirt.sh >/dev/null 2>&1 || true
	$(GO) build -o bin/kvnet-demo ./hack/demo
	./bin/kvnet-demo $(if $(KEEP),--keep)

# Cross-cluster live migration's network path without virt-handler: two
# control planes, each with kvnet (which gives the proxy pods their
# migration0 and crosscluster0 addresses) and a `kvnet proxy`; a byte
# stream from a source stand-in reaches a target stand-in through both
# proxies and is checked by count and sha256.
.PHONY: demo-crosscluster
demo-crosscluster: build control-plane
	$(GO) build -o bin/kvnet-demo ./hack/demo
	./bin/kvnet-demo --crosscluster

# Stops a demo started with KEEP=1 (the demo stops kvnet, kube-apiserver and etcd).
demo-down:
	@pid=$$(cat bin/demo/demo.pid 2>/dev/null); \
	if [ -n "$$pid" ] && [ "$$(ps -p $$pid -o comm= 2>/dev/null)" = kvnet-demo ]; then kill -TERM $$pid; \
		for i in $$(seq 1 60); do kill -0 $$pid 2>/dev/null || break; sleep 0.5; done; echo "demo stopped"; \
	else rm -f bin/demo/demo.pid; echo "no demo running"; fi

# Builds kube-apiserver and etcd from Go modules once; skipped when present.
control-plane:
	K8S_VERSION=$(K8S_VERSION) hack/control-plane.sh

# KubeVirt's own virt-controller and virt-api for the real-KubeVirt test tier,
# into bin/kubevirt/<version>: unpacked from ../shared/kubevirt/<version> and
# checked against its SHA256SUMS, else built from KUBEVIRT_SRC (or a clone of
# the tag). Skipped when present; a clear error when none of these exists.
KUBEVIRT_VERSION ?= v1.9.0
kubevirt:
	@KUBEVIRT_VERSION=$(KUBEVIRT_VERSION) hack/kubevirt.sh >/dev/null

# Builds the helm CLI the chart tests use into bin/tools once; skipped when present.
HELM_VERSION ?= v3.22.0
helm:
	@HELM_VERSION=$(HELM_VERSION) hack/helm.sh >/dev/null

# Builds prometheus and promtool (the monitoring tests run them) from
# Prometheus' Go module into bin/tools/prometheus-<version>/ once; skipped
# when present. The tests find them through KVNET_PROMETHEUS_DIR.
PROMETHEUS_VERSION ?= v3.16.0
export KVNET_PROMETHEUS_DIR ?= $(CURDIR)/bin/tools/prometheus-$(PROMETHEUS_VERSION)
prometheus:
	@PROMETHEUS_VERSION=$(PROMETHEUS_VERSION) hack/prometheus.sh >/dev/null

# Builds network-resources-injector's webhook (test/e2e runs it beside
# kvnet) from its Go module into bin/tools/nri-<version>/ once, with the
# project's deployments/; skipped when present. The tests find it through
# KVNET_NRI_DIR.
NRI_VERSION ?= v1.9.0
export KVNET_NRI_DIR ?= $(CURDIR)/bin/tools/nri-$(NRI_VERSION)
nri:
	@NRI_VERSION=$(NRI_VERSION) hack/nri.sh >/dev/null

# Unpacks ipam-extensions and kubemacpool (test/e2e runs them beside kvnet)
# from ../shared/peers into bin/tools/peers/ once, each checked against its
# SHA256SUMS line; skipped when present. The tests find them through
# KVNET_PEERS_DIR.
export KVNET_PEERS_DIR ?= $(CURDIR)/bin/tools/peers
peers:
	@hack/peers.sh >/dev/null

# Lints and renders charts/kvnet with its default values (the full matrix,
# applied to a real API server, runs in test/chart as part of `make test`).
helm-lint: helm
	bin/tools/helm lint --strict charts/kvnet
	bin/tools/helm template kvnet charts/kvnet -n kvnet-system --kube-version $(K8S_VERSION) >/dev/null

# staticcheck (honnef.co/go/tools) from the Go module proxy into bin/tools once.
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK := $(CURDIR)/bin/tools/staticcheck-$(STATICCHECK_VERSION)
$(STATICCHECK):
	@mkdir -p bin/tools; tmp=$$(mktemp -d); \
	(cd $$tmp && GOBIN=$$tmp CGO_ENABLED=0 $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)) && mv $$tmp/staticcheck $@; rm -rf $$tmp

lint: $(STATICCHECK)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

unit:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /test)

integration: control-plane helm kubevirt prometheus nri peers
	$(GO) test -count=1 -timeout 20m ./test/...

# Every test: lint, unit, integration on a real API server, fuzz seeds, a
# benchmark smoke run.
test: lint control-plane helm kubevirt prometheus nri peers
	$(GO) test -count=1 -timeout 30m ./...
	@# Every benchmark, as a smoke run: each must still run and pass its checks
	@# (test/ holds the integration suites, which start an API server and have none).
	$(GO) test -run '^$$' -bench . -skip BenchmarkLineRate -benchtime 20x -benchmem $$($(GO) list ./... | grep -v /test)
	@# The proxy line-rate table once, on small runs: each path must still carry its bytes.
	KVNET_LINERATE_MIB=64 $(GO) test -run '^$$' -bench BenchmarkLineRate -benchtime 1x ./internal/proxy/
	$(MAKE) race

# The race detector over every unit test, and over the integration tests
# where kvnet's goroutines really race (replicas competing for a lease,
# certificate rotations and allocations from two replicas at once, and the
# migration identity exchange: both proxies, the claim controller and the
# target pod's admission on one claim). Only those: -race multiplies the
# cost of the whole suite, and these are where it can find something.
# test/layout's TestRaceTierNamesExist fails when a name here is no test.
RACE_INTEGRATION ?= ^(TestConfigReloadsOnEveryReplica|TestSelfManagedCertsRacingReplicasAgree|TestMigrationTwoReplicasConcurrent|TestReplicaKilledMidAllocation|TestLeaderHandoverWhileCreating|TestIdentityTargetSide|TestIdentityAcrossClusters|TestIdentityAttacksAcrossClusters|TestIdentityRefusalsThroughBothProxies)$$
race: control-plane
	$(GO) test -count=1 -race -timeout 20m $$($(GO) list ./... | grep -v /test)
	$(GO) test -count=1 -race -timeout 20m -run '$(RACE_INTEGRATION)' ./test/

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./webhook/ ./mutators/ ./test/loadtest/

# kvnet on issue 10's loaded cluster (1,000 namespaces, 10,000 NADs, 5,000
# VMIs and virt-launcher pods) against an empty one, in one run: start-up to
# /readyz, heap held and admission cost ratios (docs/scale.md). `make test`
# runs the same test at a smoke size (20 namespaces).
.PHONY: scale
SCALE_NAMESPACES ?= 1000
scale: control-plane
	KVNET_SCALE_NAMESPACES=$(SCALE_NAMESPACES) KVNET_SCALE_ROUNDS=5 KVNET_SCALE_DURATION=2s KVNET_SCALE_CONNS=1,8 \
		$(GO) test -count=1 -timeout 60m -v -run '^TestScale$$' ./test/scale/

# The migration proxy chain against a direct loopback baseline (ratios).
# The proxy's line-rate table (docs/migration-proxy.md, "Line rate"): kvnet's
# two proxies in both hop modes beside a plain Go splice relay and HAProxy
# (when installed), each party its own process, over loopback and over veths
# between network namespaces (needs root); then the in-process chain and its
# added latency.
BENCH_PROXY_ROUNDS ?= 3
bench-proxy:
	$(GO) test -run '^$$' -bench 'BenchmarkLineRate' -benchtime $(BENCH_PROXY_ROUNDS)x ./internal/proxy/
	$(GO) test -run '^$$' -bench 'BenchmarkChain' -benchtime 2x -benchmem ./internal/proxy/

FUZZTIME ?= 30s
# Go minimizes each new input for up to 60 s by default, time that counts
# toward FUZZTIME but not toward execs; with whole-VM seeds a short run
# was then mostly minimizing.
FUZZMINIMIZETIME ?= 2s
fuzz:
	@# Every package with Fuzz targets, found rather than listed, so a new one is never skipped.
	for pkg in $$(grep -l '^func Fuzz' $$(git ls-files '*_test.go') | xargs -n1 dirname | sort -u); do \
		for t in $$($(GO) test -list '^Fuzz' ./$$pkg/ | grep ^Fuzz); do \
			$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./$$pkg/ || exit 1; \
		done; \
	done
