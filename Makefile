# stasis: `make` installs what the build and tests need and builds bin/stasis;
# `make test` runs every test. See README.md.

GO      ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# -s -w: no symbol table and no DWARF (stack traces keep their function
# names and lines). A checkpoint on preemption often starts stasis from a
# cold page cache, and the kernel reads the whole binary in on exec: 10 MB
# instead of 14 (docs/benchmarks.md).
LDFLAGS := -s -w -X github.com/stasis-ckpt/stasis/cli.Version=$(VERSION)

.PHONY: all deps build test zdtm fuzz bench clean

all: deps build

# Debian packages the tests use, the Go modules (scripts/install-deps.sh),
# a CRIU >= 4.0: the distribution's, or one built into bin/criu
# (scripts/install-criu.sh), CRIU's own tests, built once into a cache
# outside the repository (scripts/zdtm-build.sh), and SeaweedFS's weed, the
# S3 engine the object-store tests run against, built once into a cache
# outside the repository (scripts/install-seaweedfs.sh; several minutes the
# first time).
deps:
	./scripts/install-deps.sh
	./scripts/install-criu.sh
	./scripts/zdtm-build.sh
	./scripts/install-seaweedfs.sh

# bin/stasis, and the library for training loops: bin/libstasis.so (the C
# ABI of capi/stasis.h, which the Python package in python/ loads).
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/stasis ./cmd/stasis
	$(GO) build -buildmode=c-shared -ldflags "-X main.version=$(VERSION)" -o bin/libstasis.so ./capi
	rm -f bin/libstasis.h
	cp capi/stasis.h bin/stasis.h

test: build
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) test -count=1 ./...

# CRIU's own static tests, all of them (`make test` runs a subset), by hand
# with CRIU and through stasis: the counts and a line per test are printed
# and kept in build/zdtm-report.txt (docs/testing.md).
zdtm: build
	./scripts/zdtm-build.sh
	@mkdir -p build
	STASIS_ZDTM=all STASIS_ZDTM_REPORT=$(CURDIR)/build/zdtm-report.txt \
		$(GO) test -count=1 -timeout 2h -run '^TestZdtm$$' ./internal/zdtm; \
		status=$$?; cat build/zdtm-report.txt; exit $$status

# A short run of every fuzzer (the seed corpora also run in `make test`).
fuzz:
	$(GO) test ./catalog -run '^$$' -fuzz FuzzParseManifest -fuzztime 60s
	$(GO) test ./gdswriter -run '^$$' -fuzz FuzzDecode -fuzztime 60s
	$(GO) test ./gdswriter -run '^$$' -fuzz FuzzRoundTrip -fuzztime 60s

# The figures of docs/benchmarks.md (BENCH_DIR must be on the disk to measure).
BENCH_DIR ?= /var/tmp/stasis-bench
bench: build
	./bin/stasis bench --dir $(BENCH_DIR) --size 2GiB --compress none
	./bin/stasis bench --dir $(BENCH_DIR) --size 2GiB --compress auto

clean:
	rm -rf bin build
