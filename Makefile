# paddock — build, run and test. Everything here runs as root on Linux.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)

BIN      ?= bin/paddock
PREFIX   ?= /usr/local
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# paddock is linked statically (cgo is needed for libseccomp) so that one
# file runs on any Linux host. The guest (cmd/paddock-guest), which runs in
# sandboxes whose root may have no C library, is built first, without cgo
# (so static), into internal/guestbin, and embedded in paddock (the
# embedguest tag). Its symbol tables are left out: panics still print
# file:line.
GUEST_BIN      := internal/guestbin/paddock-guest
# The fast guest (internal/guestc): PID 1 in C, which serves the common
# path and hands over to the guest above for the rest; static, embedded
# beside it.
FAST_GUEST_BIN := internal/guestbin/paddock-guest-fast
FAST_GUEST_CFLAGS := -O2 -static -Wall -Wextra -Werror -s
# It is linked with musl where musl-gcc is installed (make deps installs
# it): glibc's static start-up asks the CPU for its features and caches,
# some twenty cpuid instructions, each a trap to the hypervisor on a VM:
# an exec of a static glibc program costs 0.43 ms more than one of a
# musl program here, once for every guest (docs/exec.md). Debian's musl
# headers leave the kernel's (linux/, asm/) to glibc's tree: links to
# them are made in MUSL_INC. Without musl-gcc, gcc and glibc do. FAST_CC
# is looked up when used: after make deps has installed musl-gcc.
MUSL_INC := bin/musl-include
FAST_CC = $(shell command -v musl-gcc >/dev/null 2>&1 && echo musl-gcc -isystem $(MUSL_INC) || echo gcc)
# The guest is built with Go's previous garbage collector (the opt-out
# Go 1.26 keeps, where the toolchain still knows it): a guest never
# collects in its life, and Green Tea's mark bits at the end of each
# small-object span cost it a page fault for every span it opens, 17 of
# the ~475 faults of a churn cycle (docs/exec.md).
GUEST_ENV      := $(shell GOEXPERIMENT=nogreenteagc go env GOEXPERIMENT >/dev/null 2>&1 && echo GOEXPERIMENT=nogreenteagc)
GUEST_FLAGS    := -tags 'netgo osusergo' -trimpath -ldflags '-s -w'
GOFLAGS_STATIC := -tags 'netgo osusergo embedguest' -ldflags '-linkmode external -extldflags "-static" -X github.com/paddock-dev/paddock/internal/cli.Version=$(VERSION)'
APT_DEPS := gcc libc6-dev musl-tools libseccomp-dev e2fsprogs xfsprogs util-linux iproute2 procps python3 git sudo
# chromium: the web console's browser tests (test/console_test.go, chromedp);
# tinyproxy-bin: the egress sidecar's test (test/containers_egress_test.go);
# postgresql: the dev service of examples/postgres (test/containers_postgres_test.go,
# the postgres benchmark).
TEST_DEPS := chromium tinyproxy-bin postgresql
BENCH_DEPS := bubblewrap runc postgresql

.PHONY: all build fast-guest deps test-deps kube-bins runsc s3-bins up down uninstall cluster-up cluster-down cluster-bench test test-short fuzz bench lint fmt clean

all: build

# The web console's scripts (xterm.js, uPlot; pinned by
# internal/console/web/package-lock.json) are bundled from npm into
# internal/console/dist, kept until their sources change, and embedded
# with the consoleui tag when they are there (scripts/console-assets.sh).
build: fast-guest
	@mkdir -p $(dir $(BIN))
	scripts/console-assets.sh
	CGO_ENABLED=0 $(GUEST_ENV) go build $(GUEST_FLAGS) -o $(GUEST_BIN) ./cmd/paddock-guest
	CGO_ENABLED=1 go build $(GOFLAGS_STATIC) $$(test -f internal/console/dist/app.js && echo -tags 'netgo,osusergo,embedguest,consoleui') -o $(BIN) ./cmd/paddock 2> >(grep -v -e 'statically linked applications requires' -e 'in function' >&2)

# fast-guest builds the fast guest alone: make build embeds it, and the
# native runtime's conformance test builds its own with this recipe.
fast-guest:
	@if [[ "$(FAST_CC)" == musl-gcc* ]]; then mkdir -p $(MUSL_INC) && for d in linux asm-generic; do ln -sfn /usr/include/$$d $(MUSL_INC)/$$d; done && ln -sfn /usr/include/$$(gcc -print-multiarch)/asm $(MUSL_INC)/asm; fi
	$(FAST_CC) $(FAST_GUEST_CFLAGS) -o $(FAST_GUEST_BIN) internal/guestc/*.c

# cross builds the SDK and the client-only CLI for macOS, so that neither
# comes to need the daemon's Linux-only packages.
cross:
	@for a in amd64 arm64; do \
		echo "cross: darwin/$$a"; \
		CGO_ENABLED=0 GOOS=darwin GOARCH=$$a go build -o /dev/null ./client ./cmd/paddock || exit 1; \
	done

# deps installs what is missing (Debian/Ubuntu packages).
deps:
	@missing=""; for p in $(APT_DEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi
	@# Node and npm (the E2B SDK tests): Debian's packages only when there is
	@# no node at all; a NodeSource nodejs already carries npm and conflicts
	@# with Debian's.
	@command -v npm >/dev/null || { echo "installing: nodejs npm"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	@command -v go >/dev/null || { echo "Go is missing: install Go 1.26+ at /usr/local/go"; exit 1; }

# test-deps installs what only the tests need.
test-deps: deps
	@for p in $(TEST_DEPS); do dpkg -s $$p >/dev/null 2>&1 || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(TEST_DEPS); break; }; done

# kube-bins builds the Kubernetes control plane the cluster tests run
# against (kube-apiserver and etcd, from the module proxy, pinned by the
# tools modules under tools/kube) into a cache keyed by their versions,
# /var/cache/paddock/kube by default (PADDOCK_KUBE_CACHE): about 6 minutes
# the first time, nothing after.
kube-bins:
	scripts/kube-bins.sh

# runsc builds gVisor's runsc (the gvisor runtime, --runtime gvisor) from
# the module proxy, pinned by tools/runsc/go.mod, into a cache keyed by
# its version, with its seccomp filters precompiled (tools/runsc/seccompgen),
# /var/cache/paddock/runsc by default (PADDOCK_RUNSC_CACHE):
# about 3 minutes the first time, nothing after. The daemon finds it there.
runsc:
	scripts/runsc-bin.sh

# s3-bins builds the S3-compatible object store the archive tests and the
# bench's archive section run against (SeaweedFS's weed, Apache-2.0, from
# the module proxy, pinned by tools/s3) into a cache keyed by its version,
# /var/cache/paddock/s3 by default (PADDOCK_S3_CACHE); nothing after the
# first time.
s3-bins:
	scripts/s3-bins.sh

# up installs what is missing, builds, installs and starts the daemon with
# its embedded defaults (state in /var/lib/paddock, socket at
# /run/paddock/paddock.sock, log in /var/log/paddock.log). A daemon already
# running with the same run dir is restarted (its sandboxes keep running);
# PADDOCK_RUN_DIR, PADDOCK_STATE_DIR and SERVE_FLAGS reach `paddock serve`.
# up and down stop only the daemon of their run dir: `paddock serve --stop`
# signals the process that holds its pid file's lock, never another daemon.
PADDOCK_LOG ?= /var/log/paddock.log

up: deps build runsc
	@$(BIN) serve --stop $(SERVE_FLAGS)
	install -m 0755 $(BIN) $(PREFIX)/bin/paddock
	nohup $(PREFIX)/bin/paddock serve $(SERVE_FLAGS) >>$(PADDOCK_LOG) 2>&1 &
	@for i in $$(seq 100); do $(PREFIX)/bin/paddock version 2>/dev/null | grep -q '^daemon: [^u]' && break; sleep 0.1; done
	@$(PREFIX)/bin/paddock version | grep -q '^daemon: [^u]' || { echo "paddock did not start; see $(PADDOCK_LOG)"; tail -5 $(PADDOCK_LOG); exit 1; }
	@$(PREFIX)/bin/paddock version
	@echo "paddock is up: try  paddock run -- echo hello"

down:
	$(PREFIX)/bin/paddock serve --stop $(SERVE_FLAGS)

# uninstall removes the daemon and every trace of it: its sandboxes, their
# cgroups, its storage mount, network rules, state and run dirs (a stopped
# daemon keeps them for its running sandboxes), then the installed binary.
uninstall:
	$(PREFIX)/bin/paddock serve --uninstall $(SERVE_FLAGS)
	rm -f $(PREFIX)/bin/paddock

# cluster-up starts a paddock cluster on this host: kube-apiserver and
# etcd (from kube-bins' cache), deploy/'s CRDs and RBAC, 3 nodes and 2
# gateways, everything under .cluster/ (PADDOCK_CLUSTER_DIR; the script
# lists its other settings). It waits until the gateways serve every node
# and writes .cluster/env:  . .cluster/env && paddock run -- echo hello.
# Run again, it starts what is not running. cluster-down removes every
# trace of it: processes, sandboxes, cgroups, networks, mounts, the dir.
cluster-up: build kube-bins
	PADDOCK_BIN=$(CURDIR)/$(BIN) scripts/cluster-up.sh

cluster-down:
	scripts/cluster-down.sh

# cluster-bench runs the cluster's sections of the bench (placement,
# node and gateway failure) with the longer soak, into CLUSTER-BENCH.md.
cluster-bench: build kube-bins
	PADDOCK_BIN=$(CURDIR)/$(BIN) PADDOCK_KUBE_BIN=$$(scripts/kube-bins.sh --print-dir) go run ./bench -only cluster -cluster-soak 5m -out CLUSTER-BENCH.md

# test runs every test (tests that need root skip without it), then every
# fuzz target for a short while. The unit tests run under the race
# detector; the end-to-end packages (E2E), which drive the real binary,
# without it. cross first: a client that stopped building for macOS fails.
# Four end-to-end tests at a time, not GOMAXPROCS's two: most of the
# parallel ones wait (on leases, pools, timeouts) far more than they
# compute, and the clusters among them each have a slice of the host of
# their own (test/slots_test.go).
E2E  := ./test ./bench
UNIT  = $$(go list ./... | grep -v -e '/paddock/test$$' -e '/paddock/bench$$')
test: test-deps build cross kube-bins runsc s3-bins
	PADDOCK_KUBE_BIN=$$(scripts/kube-bins.sh --print-dir) PADDOCK_S3_BIN=$$(scripts/s3-bins.sh --print-dir) go test -race -count=1 -timeout 20m $(UNIT)
	PADDOCK_BIN=$(CURDIR)/$(BIN) PADDOCK_KUBE_BIN=$$(scripts/kube-bins.sh --print-dir) PADDOCK_RUNSC=$$(scripts/runsc-bin.sh --print) PADDOCK_S3_BIN=$$(scripts/s3-bins.sh --print-dir) go test -count=1 -parallel 4 -timeout 30m $(E2E)
	$(MAKE) fuzz FUZZTIME=$(TEST_FUZZTIME)

# fuzz runs every Fuzz* function of the module for FUZZTIME each
# (scripts/fuzz.sh says how a failure is told from golang/go#75804).
FUZZTIME      ?= 20s
TEST_FUZZTIME ?= 10s
fuzz:
	PADDOCK_BIN=$(CURDIR)/$(BIN) scripts/fuzz.sh $(FUZZTIME)

test-short: build
	PADDOCK_BIN=$(CURDIR)/$(BIN) go test -count=1 -short ./...

bench: deps build runsc kube-bins s3-bins
	@for p in $(BENCH_DEPS); do dpkg -s $$p >/dev/null 2>&1 || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BENCH_DEPS); break; }; done
	@# BASE=<rev> also builds that revision and compares it with this build in
	@# alternating blocks (the "baseline" section), e.g. make bench BASE=HEAD~5.
	@if [ -n "$(BASE)" ]; then rm -rf .bench-base && mkdir -p .bench-base && \
		git archive $(BASE) | tar -x -C .bench-base && $(MAKE) -C .bench-base build VERSION=base-$(BASE); fi
	PADDOCK_BIN=$(CURDIR)/$(BIN) PADDOCK_RUNSC=$$(scripts/runsc-bin.sh --print) PADDOCK_S3_BIN=$$(scripts/s3-bins.sh --print-dir) go run ./bench -out BENCHMARKS.md $(if $(BASE),-baseline $(CURDIR)/.bench-base/bin/paddock -baseline-rev $(BASE))

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	go vet ./...
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin $(GUEST_BIN) internal/console/dist
