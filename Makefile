# ckptfs — build, run and test. `make test` is what CI runs (.ci/run).

GO      ?= go
STORE   ?= ./.ckptfs-store
MNT     ?= ./mnt
BIN     := bin/ckptfs

.PHONY: build run test test-go test-fuzz test-e2e bench lint clean

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

# Every fuzz target for a few seconds each (~1.5 min in all; test/fuzz.sh).
test-fuzz:
	test/fuzz.sh

# End-to-end: real torch/safetensors/transformers against a real mount (test/e2e).
# The first run builds .venv (~2 min, ~5.6 GB: PyPI's torch brings its CUDA
# wheels); later runs reuse it. $CKPTFS_VENV picks another place.
test-e2e:
	test/e2e/run.sh

test: lint test-go test-fuzz test-e2e

# Times ckptfs against a plain directory on the store's filesystem (1 GiB
# safetensors writes, re-save, cold/warm reads, safe_open, lazy read, RSS);
# medians of 3, as ratios. Results: bench-results.txt (KEY VALUE lines).
bench:
	test/bench/run.sh

clean:
	rm -rf bin
