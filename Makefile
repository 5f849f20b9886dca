# Quick start: `make dev` runs the service on embedded defaults, `make test`
# runs the tests. Both install redis-server first when it is missing
# (Debian, as root); the tests start their own servers.
#
# The other targets are the checks CI runs (.ci/run): `make lint`
# (gofmt, vet, staticcheck, golangci-lint), `make tidy-check`,
# `make vulncheck`, `make deploy-check` (deploy/: Kubernetes manifests,
# dashboard and alert queries), `make cover` (the tests once, with a
# coverage profile).
# The load tool (cmd/presence-load) is a Go module of its own, as deploy/
# is: its dependencies stay out of the service's go.mod, and the service's
# `go list ./...` holds only the service. Every target that tests or
# checks Go code covers both modules.
# Tools run at pinned versions with `go run module@version`: nothing to
# install, and go.mod stays the service's.
.PHONY: size-check dev test test-service test-loadtool test-short-service test-short-loadtool cover-service cover-loadtool test-format3 test-short test-js typecheck-js cover deps bench fuzz lint fmt-check vet staticcheck golangci-lint tidy-check vulndb vulncheck ci-vulncheck deploy-check

STATICCHECK   = go run honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOLANGCI_LINT = go run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
# Installed under bin/ rather than run with `go run`, which turns every
# failing exit code into 1: govulncheck's 3 means "vulnerable".
GOVULNCHECK   = bin/govulncheck-v1.9.0
# The vulnerability database site is out of reach here; its source, the
# golang.org/x/vulndb module, is on the Go module proxy, and its data/osv
# holds every OSV entry. indexdb (same module) indexes them into the
# database layout that `govulncheck -db file://` reads.
VULNDB_VERSION = v0.0.0-20261105234957-e22db6528018
VULNDB_DIR     = $(shell go env GOCACHE)/presence-vulndb-$(VULNDB_VERSION)
COVERPROFILE  ?= coverage.out
LOADTOOL      = cmd/presence-load
# The load tool's profile, beside the service's (its packages are another
# module's: `go tool cover` reads each profile in its own module).
LOAD_COVERPROFILE ?= coverage-loadtool.out

deps:
	@command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || \
	  { echo "installing redis-server"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@command -v node >/dev/null 2>&1 || \
	  { echo "installing nodejs"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null; }
	@command -v python3 >/dev/null 2>&1 || \
	  { echo "installing python3"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 >/dev/null; }

# Built, then run, rather than `go run`: the go command exits 1 when it is
# interrupted, whatever its child does, and make would print "Error 1" for
# a Ctrl-C. presenced itself exits 0 on SIGINT after draining.
# make dev ARGS='--listen 127.0.0.1:9080 --nats-port -1' passes flags on.
dev: deps
	go build -buildvcs=auto -o bin/presenced ./cmd/presenced
	./bin/presenced dev $(ARGS)

# The two modules' tests side by side (-j2), as one `go test ./...` ran
# the packages of both before the load tool had its own module: the
# service's suite mostly waits, the load tool's is seconds of compiling.
test: deps
	$(MAKE) --no-print-directory -j2 -Oline test-service test-loadtool
	$(MAKE) --no-print-directory test-format3 test-js

test-service:
	go test -race -count=1 ./...

test-loadtool:
	cd $(LOADTOOL) && go test -race -count=1 ./...

# The region's tests in a build of the test format 3 (region/format_three.go):
# a release of the next format reads the region as the current one wrote it.
# The end-to-end rollout (cmd/presenced, TestE2EFormat*) builds it itself.
test-format3:
	go test -race -count=1 -tags presenceformat3 ./region

# The browser client's unit tests (Node's built-in runner; no packages).
test-js:
	cd clients/js && node --test test/

# The client's TypeScript declarations checked against an example
# (typescript, its one devDependency, from the npm registry).
typecheck-js:
	cd clients/js && npm ci --no-audit --no-fund --loglevel=error && npm run --silent typecheck

# The fast loop: the slow end-to-end tests skip themselves under -short.
test-short: deps
	$(MAKE) --no-print-directory -j2 -Oline test-short-service test-short-loadtool
	$(MAKE) --no-print-directory test-js

test-short-service:
	go test -short -race -count=1 ./...

test-short-loadtool:
	cd $(LOADTOOL) && go test -short -race -count=1 ./...

# The tests as `make test` runs them, once, with a coverage profile of
# each package's own statements, and the total.
# The load tool's total is printed apart: it is another module's.
cover: deps
	$(MAKE) --no-print-directory -j2 -Oline cover-service cover-loadtool
	$(MAKE) --no-print-directory test-format3 test-js

cover-service:
	go test -race -count=1 -coverprofile=$(COVERPROFILE) ./...
	@go tool cover -func=$(COVERPROFILE) | tail -n 1

cover-loadtool:
	cd $(LOADTOOL) && go test -race -count=1 -coverprofile=$(abspath $(LOAD_COVERPROFILE)) ./...
	@cd $(LOADTOOL) && echo "load tool ($(LOADTOOL)): $$(go tool cover -func=$(abspath $(LOAD_COVERPROFILE)) | tail -n 1)"

lint: fmt-check vet staticcheck golangci-lint

# No tracked file over 1 MB: build outputs and data dumps stay out of git.
size-check:
	@big=$$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 1048576 {print $$2 " (" $$1 " bytes)"}'); \
	  test -z "$$big" || { echo "tracked files over 1 MB:"; echo "$$big"; exit 1; }

fmt-check:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

vet:
	go vet ./...
	cd $(LOADTOOL) && go vet ./...

staticcheck:
	$(STATICCHECK) ./...
	cd $(LOADTOOL) && $(STATICCHECK) ./...

# Configured in .golangci.yml (its paths are relative to it, in both
# modules).
golangci-lint:
	$(GOLANGCI_LINT) run ./...
	cd $(LOADTOOL) && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...

# go.mod and go.sum as `go mod tidy` would leave them, in both modules.
tidy-check:
	@go mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }
	@cd $(LOADTOOL) && go mod tidy -diff || { echo "$(LOADTOOL)/go.mod, go.sum are not tidy: cd $(LOADTOOL) && go mod tidy"; exit 1; }

# The deployment files, checked by deploy/'s tests: the Kubernetes
# manifests decoded with the Kubernetes API types, every dashboard query
# and alert rule parsed with Prometheus's PromQL parser. deploy/ is a Go
# module of its own, so k8s.io/api and prometheus stay out of go.mod.
deploy-check:
	cd deploy && go mod tidy -diff || { echo "deploy/go.mod, go.sum are not tidy: cd deploy && go mod tidy"; exit 1; }
	cd deploy && go vet ./... && go test -count=1 ./...

$(GOVULNCHECK):
	GOBIN=$(CURDIR)/bin go install golang.org/x/vuln/cmd/govulncheck@v1.9.0
	mv bin/govulncheck $(GOVULNCHECK)

vulndb: $(VULNDB_DIR)/index/db.json

$(VULNDB_DIR)/index/db.json:
	go mod download golang.org/x/vulndb@$(VULNDB_VERSION)
	rm -rf $(VULNDB_DIR).tmp
	go run golang.org/x/vulndb/cmd/indexdb@$(VULNDB_VERSION) \
	  -vulns $$(go env GOMODCACHE)/golang.org/x/vulndb@$(VULNDB_VERSION)/data/osv -out $(VULNDB_DIR).tmp
	rm -rf $(VULNDB_DIR) && mv $(VULNDB_DIR).tmp $(VULNDB_DIR)

# Every known vulnerability the code reaches, in its modules and in the
# standard library of the Go that builds it; fails on any. Both modules.
vulncheck: vulndb $(GOVULNCHECK)
	$(GOVULNCHECK) -db file://$(VULNDB_DIR) ./...
	cd $(LOADTOOL) && $(CURDIR)/$(GOVULNCHECK) -db file://$(VULNDB_DIR) ./...

# CI's: fails on a vulnerability reached in a module (go.mod fixes it);
# one only in the standard library is fixed by a newer Go on the machine,
# not by a commit, so it is reported and does not fail.
ci-vulncheck: vulndb $(GOVULNCHECK)
	@for dir in . $(LOADTOOL); do \
	  out=$$(cd $$dir && $(CURDIR)/$(GOVULNCHECK) -db file://$(VULNDB_DIR) ./... 2>&1); rc=$$?; echo "$$out"; \
	  if [ $$rc -eq 0 ]; then continue; fi; \
	  if [ $$rc -ne 3 ]; then exit $$rc; fi; \
	  if echo "$$out" | grep -Eq 'Found in: [^ ]+@v'; then echo "vulncheck: a module the code calls is vulnerable: upgrade it in $$dir/go.mod"; exit 1; fi; \
	  echo "vulncheck: WARNING: only the standard library of $$(go env GOVERSION) is affected; upgrade Go on the machine"; \
	done

bench: deps
	go test ./region -run '^$$' -bench BenchmarkRefresh -count 3

# The decoders of what arrives from NATS, 30 s each.
fuzz:
	go test ./bus -run '^$$' -fuzz FuzzDecodeEvent -fuzztime 30s
	go test ./global -run '^$$' -fuzz FuzzDecodePublication -fuzztime 30s
