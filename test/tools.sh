#!/usr/bin/env bash
# tools.sh: build the external programs the tests run (cached in $CKPTFS_TOOLS,
# default ~/.cache/ckptfs/tools). Idempotent; prints where each one is.
#
#  - versitygw: an S3-compatible gateway serving a local directory (the
#    remote-tier tests start it on 127.0.0.1). Built with `go install` from
#    the module proxy: no prebuilt binary is downloaded.
#  - moto's server (moto[server] from PyPI, in its own venv): the second S3
#    implementation the remote tier is tested against (CKPTFS_S3_SERVER=moto,
#    make test-s3-moto). Needs python3 with venv.
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

moto_version=5.2.5
moto_venv="$tools/moto-venv"
if [ ! -f "$moto_venv/.moto-$moto_version" ]; then
	echo "== installing moto[server] $moto_version (once; cached in $moto_venv)"
	start=$SECONDS
	rm -rf "$moto_venv"
	python3 -m venv "$moto_venv"
	"$moto_venv/bin/pip" install -q --disable-pip-version-check "moto[server]==$moto_version"
	touch "$moto_venv/.moto-$moto_version"
	echo "moto installed in $((SECONDS - start)) s"
fi
echo "moto_server: $moto_venv/bin/moto_server"
