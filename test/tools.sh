#!/usr/bin/env bash
# tools.sh: build the external programs the tests run (cached in $CKPTFS_TOOLS,
# default ~/.cache/ckptfs/tools). Idempotent; prints where each one is.
#
#  - versitygw: an S3-compatible gateway serving a local directory (the
#    remote-tier tests start it on 127.0.0.1). Built with `go install` from
#    the module proxy: no prebuilt binary is downloaded.
set -euo pipefail
tools=${CKPTFS_TOOLS:-$HOME/.cache/ckptfs/tools}
mkdir -p "$tools/bin"
versitygw_version=v1.8.0
if [ "$("$tools/bin/versitygw" --version 2>/dev/null | grep -o 'v[0-9.]*' | head -1)" != "$versitygw_version" ] &&
	[ ! -f "$tools/bin/.versitygw-$versitygw_version" ]; then
	echo "== building versitygw $versitygw_version (once; cached in $tools/bin)"
	start=$SECONDS
	GOBIN="$tools/bin" go install "github.com/versity/versitygw/cmd/versitygw@$versitygw_version"
	touch "$tools/bin/.versitygw-$versitygw_version"
	echo "versitygw built in $((SECONDS - start)) s"
fi
echo "versitygw: $tools/bin/versitygw"
