#!/usr/bin/env bash
# make bench: builds ckptfs, prepares the e2e venv (safetensors, numpy), and runs
# bench.py (its flags pass through: --steps 3,3b,9 --repeat 1 --size-mib 512).
# Needs root (drop_caches, mount). Results: bench-results.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${CKPTFS_VENV:-$repo/.venv}
"$repo/test/e2e/setup_venv.sh" "$venv"
(cd "$repo" && go build -o bin/ckptfs ./cmd/ckptfs && go build -o bin/fusefloor ./test/bench/fusefloor)
"$venv/bin/python" "$here/bench.py" --bin "$repo/bin/ckptfs" --floor-bin "$repo/bin/fusefloor" \
	--out "$repo/bench-results.txt" "$@"

# The remote tier's steps run with every step, or when --steps names 8.
steps=all prev=
for a in "$@"; do
	case $a in --steps=*) steps=${a#--steps=} ;; esac
	[ "$prev" = --steps ] && steps=$a
	prev=$a
done
case ",$steps," in ,all, | *,8,*) ;; *) exit 0 ;; esac

# The remote tier's S3 backend against versitygw on loopback (test/tools.sh
# builds it): 1 MiB chunk objects, PUT and GET, 32 at a time. This is the
# ceiling of the write-back uploader and of lazy fetches on this machine.
echo "== S3 backend on loopback (versitygw)"
out=$(cd "$repo" && go test -run '^$' -bench '^Benchmark(Put|Get)$' -benchtime 3s -count 3 ./cas/backend/s3)
echo "$out" | grep '^Benchmark'
median() { awk -v b="$1" '$1 ~ "^Benchmark" b {print $(NF-1)}' | sort -n | sed -n 2p; }
{
	echo "8_remote_put_1MiB.MBps $(echo "$out" | median Put)"
	echo "8_remote_get_1MiB.MBps $(echo "$out" | median Get)"
} >>"$repo/bench-results.txt"
tail -2 "$repo/bench-results.txt"

# The remote tier through the mount (test/remote_test.go): local write rate
# with and without a remote, the rate at which writes reach the bucket, and
# a fresh mount's lazy read of one tensor (bytes fetched ÷ tensor bytes).
echo "== remote tier through the mount (versitygw on loopback)"
(cd "$repo" && CKPTFS_VENV="$venv" CKPTFS_BENCH_OUT="$repo/bench-results.txt" \
	go test -tags remote_e2e -count=1 -timeout 30m -run '^$' -bench '^BenchmarkRemote$' -benchtime 1x -v ./test |
	grep -E '^(---|ok|FAIL)|MB/s|^ *9_')
