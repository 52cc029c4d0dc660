# ckptfs — build, run and test. `make test` is what CI runs (.ci/run).

GO      ?= go
STORE   ?= ./.ckptfs-store
MNT     ?= ./mnt
BIN     := bin/ckptfs

.PHONY: build run test test-go lint clean

build:
	$(GO) build -o $(BIN) ./cmd/ckptfs

# Build, then mount $(STORE) (created if missing) at $(MNT) in the foreground.
# Ctrl-C unmounts. Needs root and /dev/fuse.
run: build
	mkdir -p $(MNT)
	$(BIN) mount $(STORE) $(MNT)

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Every Go test, race detector on (the FUSE handlers are concurrent).
test-go:
	$(GO) test -race -count=1 -timeout 40m ./...

test: lint test-go

clean:
	rm -rf bin
