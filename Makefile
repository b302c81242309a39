# pgpilot — `make help` lists the targets.

# Tools and the control plane the tests use are built from source once and cached here,
# keyed by version, so fresh clones on the same machine reuse them.
PGPILOT_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/pgpilot
export PGPILOT_CACHE

VERSION ?= 0.1.0
IMG ?= controller:latest
GO_VERSION := $(shell sed -n 's/^go \([0-9]*\.[0-9]*\).*/\1/p' go.mod)

TOOLS := $(PGPILOT_CACHE)/tools
# Debian's PgBouncer, which the pooler runs (docs/pooler.md); test/pg runs it too.
PGBOUNCER := /usr/sbin/pgbouncer
CONTROLLER_GEN_VERSION ?= v0.17.2
CONTROLLER_GEN := $(TOOLS)/controller-gen-$(CONTROLLER_GEN_VERSION)/controller-gen
KUSTOMIZE_VERSION ?= v5.5.0
KUSTOMIZE := $(TOOLS)/kustomize-$(KUSTOMIZE_VERSION)/kustomize
OPERATOR_SDK_VERSION ?= v1.34.1
OPERATOR_SDK := $(TOOLS)/operator-sdk-$(OPERATOR_SDK_VERSION)/operator-sdk
OPM_VERSION ?= v1.35.0
OPM := $(TOOLS)/opm-$(OPM_VERSION)/opm
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT := $(TOOLS)/golangci-lint-$(GOLANGCI_LINT_VERSION)/golangci-lint
# Prometheus 3.16's module version: promtool checks the alert rules (make test-quick),
# prometheus runs the monitoring proof on the local node (make e2e-monitoring). The
# server is built without its web UI's assets: its API is what the tests use.
PROMETHEUS_VERSION ?= v0.316.0
PROMTOOL := $(TOOLS)/promtool-$(PROMETHEUS_VERSION)/promtool
PROMETHEUS := $(TOOLS)/prometheus-$(PROMETHEUS_VERSION)/prometheus
export PROMTOOL PROMETHEUS

# OLM bundle and catalog. IMAGE_TAG_BASE names the images: $(IMAGE_TAG_BASE):<version>
# (the operator), $(IMAGE_TAG_BASE)-bundle:v<version>, $(IMAGE_TAG_BASE)-catalog:v<version>,
# and $(IMAGE_TAG_BASE)-pgbouncer:<PgBouncer's version> (the pooler's, make image-pgbouncer;
# its version is config/manager's RELATED_IMAGE_PGBOUNCER's tag).
IMAGE_TAG_BASE ?= example.com/pgpilot
# The operator image the bundle's CSV runs: IMG when given, else $(IMAGE_TAG_BASE):$(VERSION).
BUNDLE_OPERATOR_IMG ?= $(if $(filter file,$(origin IMG)),$(IMAGE_TAG_BASE):$(VERSION),$(IMG))
BUNDLE_IMG ?= $(IMAGE_TAG_BASE)-bundle:v$(VERSION)
CATALOG_IMG ?= $(IMAGE_TAG_BASE)-catalog:v$(VERSION)
CHANNELS ?= candidate,stable
DEFAULT_CHANNEL ?= stable
# Base of the catalog image: opm serves the catalog (catalog.Dockerfile).
OPM_IMAGE ?= quay.io/operator-framework/opm:$(OPM_VERSION)

# kubectl: the one on PATH, else the one built with the control plane.
KUBECTL ?= $(or $(shell command -v kubectl 2>/dev/null),$(shell bash hack/control-plane.sh)/kubectl)

CRD := config/crd/bases/db.example.com_postgresclusters.yaml

.DEFAULT_GOAL := help

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
		/^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } \
		/^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD, the controller's RBAC, the chart's values.schema.json and Grafana dashboard.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=controller-role paths=./internal/operator/controller/... output:rbac:artifacts:config=config/rbac/controller
	go run ./hack/values-schema $(CRD) helm-charts/postgrescluster/values.schema.json
	go run ./hack/dashboard helm-charts/postgrescluster/dashboards/pgpilot.json

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate the API types' DeepCopy methods.
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: fmt
fmt: ## gofmt the code.
	gofmt -w api cmd internal hack test

.PHONY: vet
vet: ## go vet the code.
	go vet ./...

.PHONY: verify
verify: generate manifests ## Check that generated files and formatting are current.
	@test -z "$$(gofmt -l api cmd internal hack test)" || { gofmt -l api cmd internal hack test; echo "run make fmt"; exit 1; }
	@git diff --exit-code -- api config helm-charts || { echo "generated files are stale: run make generate manifests and commit"; exit 1; }

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Lint: golangci-lint (.golangci.yml) on every package and build tag, shellcheck (.shellcheckrc) on every shell script.
	$(GOLANGCI_LINT) run ./...
	@bash hack/apt-install.sh shellcheck shellcheck
	shellcheck $$(git ls-files '*.sh' .ci/run)

.PHONY: control-plane
control-plane: ## Build (once) the kube-apiserver, etcd and kubectl the tests use.
	@bash hack/control-plane.sh >/dev/null

.PHONY: postgres
postgres: ## Install (once) Debian's PostgreSQL 15 and PgBouncer, which the real-PostgreSQL tests run, and carry out PostgreSQL 17 for the upgrade tests.
	@bash hack/install-postgres.sh
	@bash hack/apt-install.sh $(PGBOUNCER) pgbouncer
	@bash hack/postgres-next.sh >/dev/null

.PHONY: s3server
s3server: ## Build (once) the versitygw S3 server the backup store's tests run.
	@bash hack/versitygw.sh >/dev/null

.PHONY: test
test: test-quick e2e chaos-short ## Run every test: test-quick, then e2e and the fault suite's short version on a real local Kubernetes node (root).

# -parallel: test/pg's tests run side by side (each its own clusters, addresses and
# operator), three at a time; go test's default is GOMAXPROCS, two on a 2-core machine,
# and more than three at once overloads one (Lease renewals late, failovers the tests
# do not expect). No other package's tests call t.Parallel.
TEST_PARALLEL ?= 3

.PHONY: test-quick
test-quick: vet control-plane postgres s3server $(PROMTOOL) ## Unit, chart, alert rules (promtool), integration on a real kube-apiserver + etcd, and real PostgreSQL (no root needed once PostgreSQL is installed).
	KUBEBUILDER_ASSETS="$$(bash hack/control-plane.sh)" PGPILOT_PG_NEXT="$$(bash hack/postgres-next.sh)" go test -count=1 -timeout 40m -parallel $(TEST_PARALLEL) ./...

.PHONY: bench
bench: bench-quick bench-e2e ## Print every benchmark's figures (no timing assertions); bench-e2e needs root.

BENCH_SCALE_N ?= 10,100,300,1000

.PHONY: bench-scale
bench-scale: control-plane ## Print what the operator costs at BENCH_SCALE_N clusters (hollow instances on a real kube-apiserver + etcd).
	KUBEBUILDER_ASSETS="$$(bash hack/control-plane.sh)" go run ./hack/benchscale -n $(BENCH_SCALE_N)

.PHONY: bench-e2e
bench-e2e: ## Print failover figures on a real local Kubernetes node: 10 primary pod deletions (E2E_BENCHTIME=20x for more).
	@E2E_BENCH=. bash hack/e2e/run.sh

.PHONY: bench-quick
bench-quick: control-plane postgres s3server ## Print the benchmarks' figures of the integration and real-PostgreSQL suites.
	KUBEBUILDER_ASSETS="$$(bash hack/control-plane.sh)" go test -count=1 -run '^$$' -bench . -benchtime 20x ./test/integration/
	KUBEBUILDER_ASSETS="$$(bash hack/control-plane.sh)" PGPILOT_PG_NEXT="$$(bash hack/postgres-next.sh)" go test -count=1 -run '^$$' -bench . -skip 'BenchmarkMajorUpgrade|BenchmarkCommitGate' -benchtime 20x -timeout 30m ./test/pg/
	KUBEBUILDER_ASSETS="$$(bash hack/control-plane.sh)" PGPILOT_PG_NEXT="$$(bash hack/postgres-next.sh)" go test -count=1 -run '^$$' -bench BenchmarkMajorUpgrade -benchtime 3x -timeout 30m ./test/pg/
	KUBEBUILDER_ASSETS="$$(bash hack/control-plane.sh)" go test -count=1 -run '^$$' -bench BenchmarkCommitGate -benchtime 3x -timeout 30m ./test/pg/

##@ Build and run

.PHONY: build
build: ## Build the manager, controller and agent into bin/.
	go build -o bin/ ./cmd/...

.PHONY: plugin
plugin: ## Build the kubectl plugin into bin/: kubectl-pgpilot, and kubectl_complete-pgpilot for kubectl's completion of it; put bin/ on PATH.
	go build -trimpath -ldflags "-s -w" -o bin/kubectl-pgpilot ./cmd/kubectl-pgpilot
	printf '#!/bin/sh\n# kubectl (1.26 and later) completes kubectl pgpilot through this.\nexec kubectl-pgpilot __complete "$$@"\n' > bin/kubectl_complete-pgpilot
	chmod +x bin/kubectl_complete-pgpilot

.PHONY: run
run: build ## Run the operator against the current kubeconfig, or an embedded local control plane when none is reachable.
	@bash hack/run.sh

.PHONY: docker-build
docker-build: ## Build the operator image IMG.
	docker build --build-arg GO_VERSION=$(GO_VERSION) --build-arg VERSION=$(VERSION) \
		--build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push the operator image IMG.
	docker push $(IMG)

##@ Images

.PHONY: image-operator
image-operator: ## Build the operator image as a tarball in $PGPILOT_CACHE/images, without Docker; print it and its reference.
	@VERSION=$(VERSION) bash hack/images/operator.sh

.PHONY: image-postgres
image-postgres: ## Build (once per Debian version) the PostgreSQL 15 image pgpilot-postgres:15 as a tarball; root to build.
	@bash hack/images/postgres.sh

.PHONY: image-pgbouncer
image-pgbouncer: ## Build (once per Debian version) the pooler's PgBouncer image pgpilot-pgbouncer:<version> as a tarball; root to build.
	@bash hack/images/pgbouncer.sh

##@ Local cluster and end to end (root: network namespaces, mounts, cgroups)

.PHONY: demo
demo: ## Bring up a local single-node Kubernetes cluster, deploy pgpilot and the example cluster; leave it running.
	@bash hack/e2e/demo.sh

.PHONY: demo-down
demo-down: ## Stop the local cluster and remove everything it made (make demo's and make e2e's).
	@bash hack/localcluster/down.sh

.PHONY: e2e
e2e: ## Run test/e2e on a fresh local cluster, then tear it down and check nothing is left (E2E_RUN=regexp, E2E_KEEP=1).
	@bash hack/e2e/run.sh

.PHONY: test-monitoring
test-monitoring: control-plane postgres s3server $(PROMETHEUS) ## A real Prometheus scrapes real agents (test/pg) and PgpilotWALArchiveFailing fires and resolves (about 8 minutes; not in make test).
	KUBEBUILDER_ASSETS="$$(bash hack/control-plane.sh)" go test -count=1 -tags monitoring -run '^TestPrometheusAlertsOnRealInstances$$' -timeout 20m -v ./test/pg/

.PHONY: e2e-monitoring
e2e-monitoring: $(PROMETHEUS) ## The monitoring proof on a fresh local cluster: a real Prometheus scrapes it with the PodMonitor's settings and evaluates the PrometheusRule; kubectl pgpilot status (about 20 minutes; not in make test).
	@E2E_TAGS=monitoring E2E_RUN='^TestMonitoring$$' bash hack/e2e/run.sh

.PHONY: chaos
chaos: ## Run the fault suite on a fresh local cluster: every fault on the primary, in every mode (async, async-budget, sync, sync-local, async-pooler, sync-pooler), CHAOS_ROUNDS (3) each (CHAOS_FAULTS=regexp, CHAOS_MODES=regexp, CHAOS_KEEP=1).
	@bash hack/chaos/run.sh

.PHONY: chaos-short
chaos-short: ## The fault suite's CI subset: eviction, container kill, sandbox kill, freeze, network cut, client-reachable cut, the operator's leader killed after a revocation or cut off from the pods; async and sync, 1 round each.
	@CHAOS_SHORT=1 bash hack/chaos/run.sh

.PHONY: localcluster
localcluster: ## Build (once) and start the local cluster alone; prints its kubeconfig (use it through hack/localcluster/exec.sh).
	@bash hack/localcluster/up.sh

##@ OLM on the local cluster (root)

.PHONY: olm
olm: $(OPM) ## Install OLM (built from source, its images pushed to the node's registry) into the local cluster, started when not up; make demo-down removes it.
	@OPM=$(OPM) OPM_VERSION=$(OPM_VERSION) bash hack/olm/up.sh

.PHONY: olm-e2e
olm-e2e: $(OPM) $(OPERATOR_SDK) $(KUSTOMIZE) ## On a fresh local cluster with OLM: operator-sdk run bundle, a Subscription, an upgrade, scorecard; the example cluster fails over after each (OLM_E2E_RUN=regexp, OLM_E2E_KEEP=1).
	@OPM=$(OPM) OPM_VERSION=$(OPM_VERSION) OPERATOR_SDK=$(OPERATOR_SDK) OPERATOR_SDK_VERSION=$(OPERATOR_SDK_VERSION) \
		KUSTOMIZE=$(KUSTOMIZE) VERSION=$(VERSION) IMAGE_TAG_BASE=$(IMAGE_TAG_BASE) CHANNELS=$(CHANNELS) \
		DEFAULT_CHANNEL=$(DEFAULT_CHANNEL) bash hack/olm/e2e.sh

##@ Bundle and catalog

.PHONY: bundle
bundle: $(KUSTOMIZE) $(OPERATOR_SDK) ## Regenerate the OLM bundle (bundle/, bundle.Dockerfile) from config/ and validate it.
	KUSTOMIZE=$(KUSTOMIZE) OPERATOR_SDK=$(OPERATOR_SDK) VERSION=$(VERSION) OPERATOR_IMG=$(BUNDLE_OPERATOR_IMG) \
		IMAGE_TAG_BASE=$(IMAGE_TAG_BASE) CHANNELS=$(CHANNELS) DEFAULT_CHANNEL=$(DEFAULT_CHANNEL) bash hack/bundle.sh
	$(OPERATOR_SDK) bundle validate ./bundle --image-builder none --select-optional suite=operatorframework

.PHONY: bundle-build
bundle-build: ## Build the bundle image BUNDLE_IMG.
	docker build -f bundle.Dockerfile -t $(BUNDLE_IMG) .

.PHONY: bundle-push
bundle-push: ## Push the bundle image BUNDLE_IMG.
	docker push $(BUNDLE_IMG)

.PHONY: catalog
catalog: $(OPM) ## Write the file-based catalog (catalog/) that serves BUNDLE_IMG, from bundle/.
	go run ./hack/catalog -bundle bundle -image $(BUNDLE_IMG) -catalog catalog/pgpilot/catalog.yaml
	$(OPM) validate catalog

.PHONY: catalog-build
catalog-build: ## Build the catalog image CATALOG_IMG (OLM pulls BUNDLE_IMG itself when it installs).
	docker build -f catalog.Dockerfile --build-arg OPM_IMAGE=$(OPM_IMAGE) -t $(CATALOG_IMG) .

.PHONY: catalog-push
catalog-push: ## Push the catalog image CATALOG_IMG.
	docker push $(CATALOG_IMG)

.PHONY: verify-bundle
verify-bundle: ## Check that the committed bundle and catalog are what make bundle catalog generate.
	$(MAKE) bundle
	$(MAKE) catalog
	@test -z "$$(git status --porcelain -- bundle bundle.Dockerfile catalog)" || { git status --short -- bundle bundle.Dockerfile catalog; \
		git diff -- bundle bundle.Dockerfile catalog; echo "the bundle or catalog is stale: run make bundle catalog and commit"; exit 1; }

##@ Deployment (current kubeconfig)

.PHONY: install
install: manifests $(KUSTOMIZE) ## Install the CRDs.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) apply --server-side -f -

.PHONY: uninstall
uninstall: $(KUSTOMIZE) ## Remove the CRDs (and with them every PostgresCluster; volumes are kept).
	$(KUSTOMIZE) build config/crd | $(KUBECTL) delete --ignore-not-found -f -

.PHONY: deploy
deploy: manifests $(KUSTOMIZE) ## Deploy the operator with image IMG.
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	$(KUSTOMIZE) build config/default | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy
undeploy: $(KUSTOMIZE) ## Remove the operator (PostgresClusters must be deleted first, or their finalizer waits for it).
	$(KUSTOMIZE) build config/default | $(KUBECTL) delete --ignore-not-found -f -

# Tools, built once per version into $(TOOLS).

$(CONTROLLER_GEN):
	GOBIN=$(dir $@) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

$(GOLANGCI_LINT):
	GOBIN=$(dir $@) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

$(KUSTOMIZE):
	GOBIN=$(dir $@) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

$(OPERATOR_SDK):
	bash hack/olm-tool.sh operator-sdk $(OPERATOR_SDK_VERSION) $(dir $@)

$(OPM):
	bash hack/olm-tool.sh opm $(OPM_VERSION) $(dir $@)

.PHONY: promtool
promtool: $(PROMTOOL) ## Build (once) promtool, which tests the chart's alert rules; print its path.
	@echo $(PROMTOOL)

.PHONY: prometheus
prometheus: $(PROMETHEUS) ## Build (once) the Prometheus server, without its web UI; print its path.
	@echo $(PROMETHEUS)

$(PROMTOOL):
	GOBIN=$(dir $@) go install github.com/prometheus/prometheus/cmd/promtool@$(PROMETHEUS_VERSION)

$(PROMETHEUS):
	GOBIN=$(dir $@) go install github.com/prometheus/prometheus/cmd/prometheus@$(PROMETHEUS_VERSION)
