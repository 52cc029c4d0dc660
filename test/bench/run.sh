#!/usr/bin/env bash
# make bench: builds ckptfs, prepares the e2e venv (safetensors, numpy), and runs
# bench.py. Needs root (drop_caches, mount). Results: bench-results.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${CKPTFS_VENV:-$repo/.venv}
"$repo/test/e2e/setup_venv.sh" "$venv"
(cd "$repo" && go build -o bin/ckptfs ./cmd/ckptfs)
exec "$venv/bin/python" "$here/bench.py" --bin "$repo/bin/ckptfs" --out "$repo/bench-results.txt" "$@"
