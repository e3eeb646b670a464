# kinst: the two commands are `make demo` and `make test` (see README.md).
# Both install what they need on a fresh Debian 12 machine (as root).

SHELL  := /bin/bash
GO     ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
CACHE  ?= $(CURDIR)/.cache
STRESS ?= 2000

export KINST_CACHE := $(CACHE)
export CGO_ENABLED := 0
# kinst --version reports the commit it was built from: stamp it from git
# even where the Go configuration turns stamping off (not from a tarball).
BUILDVCS := $(if $(wildcard .git),-buildvcs=true)

.PHONY: all deps build install docs demo drilldown test unit fuzz vm-up vm-down clean

all: build

# apt packages and Go modules; the Debian kernel image and the matching
# headers are fetched by `kinst vm up` (cached under $(CACHE)).
deps:
	@scripts/deps.sh
	@$(GO) mod download

# Static binaries: the same files run on the host and inside the guest.
build:
	@mkdir -p bin
	$(GO) build -trimpath $(BUILDVCS) -o bin/kinst ./cmd/kinst
	$(GO) build -trimpath $(BUILDVCS) -o bin/kerninstd ./cmd/kerninstd

# The binaries and the man pages (kinst(1), kinst-count(1), …) under
# $(DESTDIR)$(PREFIX).
PREFIX ?= /usr/local
install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 755 bin/kinst bin/kerninstd $(DESTDIR)$(PREFIX)/bin/
	install -m 644 docs/man/*.1 $(DESTDIR)$(PREFIX)/share/man/man1/

# docs/commands.md and docs/man from the command table (a unit test
# fails when they drift).
docs:
	$(GO) generate ./cmd/kinst

demo: deps build
	@scripts/demo.sh

# KernInst's drill-down from copen (do_sys_openat2) under an O_CREAT|O_TRUNC
# workload: where the time goes, level by level.
drilldown: deps build
	@scripts/drilldown.sh

# Unit tests, then the live-VM tests (one VM per test package). The
# per-package timeout is a hang's backstop, not a budget: test/live took
# 25-40 minutes on the same 2-core machine from one run to the next.
test: deps build
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: files above need formatting"; exit 1; }
	KINST_LIVE=1 KINST_BIN=$(CURDIR)/bin KINST_STRESS_CYCLES=$(STRESS) $(GO) test -p 1 -timeout 60m -count=1 ./...

# The live-VM packages skip themselves unless KINST_LIVE=1.
unit:
	$(GO) test ./...

# Short fuzzing runs of the dump readers (/proc/kcore's too), the printk
# reader, the slab walk, the saved type graph's reader, and the unwinding inputs: the CFI parser and interpreter, the CFA
# expression evaluation, whole ELF files (checks, relocation, symbols),
# the symbol reader and the ORC reader (their seed corpora already run in
# `make unit`); FUZZTIME each.
FUZZTIME ?= 10s
fuzz:
	for t in FuzzELF FuzzKdump FuzzFlattened FuzzMinidump FuzzKcore; do \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./core/dump || exit 1; done
	for t in FuzzLog FuzzFreeBSDMessageBuffer; do \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./core || exit 1; done
	$(GO) test -run '^$$' -fuzz '^FuzzWalk$$' -fuzztime $(FUZZTIME) ./core/slab
	$(GO) test -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZTIME) ./core/typegraph
	for t in FuzzCFI FuzzCFAExpression FuzzELF; do \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./unwind || exit 1; done
	$(GO) test -run '^$$' -fuzz '^FuzzSymbols$$' -fuzztime $(FUZZTIME) ./internal/elfsym
	$(GO) test -run '^$$' -fuzz '^FuzzORC$$' -fuzztime $(FUZZTIME) ./unwind/orc

vm-up: deps build
	bin/kinst vm up

vm-down:
	bin/kinst vm down

clean:
	rm -rf bin
