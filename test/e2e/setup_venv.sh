#!/usr/bin/env bash
# setup_venv.sh [VENV_DIR]: make VENV_DIR a virtualenv holding what the
# end-to-end suite needs (requirements.txt, pinned; constraints.txt freezes the
# transitive set). VENV_DIR defaults to $CKPTFS_VENV, else <repo>/.venv.
#
# Idempotent: the venv keeps a stamp with the hash of both files and of the
# interpreter's version; when it matches, this returns at once. Otherwise it
# creates the venv if needed (or recreates it if its python no longer runs) and
# lets pip bring it to the pins. Only PyPI is used.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${1:-${CKPTFS_VENV:-$repo/.venv}}
python=${PYTHON:-python3}
stamp=$venv/.ckptfs-e2e-stamp

want=$({ cat "$here/requirements.txt" "$here/constraints.txt"; "$python" -VV; } | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c '' 2>/dev/null; then
	echo "e2e venv $venv is up to date"
	exit 0
fi

if ! "$venv/bin/python" -c '' 2>/dev/null; then
	echo "e2e venv: creating $venv"
	rm -rf "$venv"
	"$python" -m venv "$venv"
fi

echo "e2e venv: installing requirements into $venv (torch with its CUDA wheels is ~5.6 GB; ~2 min on a fresh machine)"
start=$SECONDS
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off
rm -f "$stamp"
"$venv/bin/python" -m pip install --quiet \
	-r "$here/requirements.txt" -c "$here/constraints.txt"
"$venv/bin/python" -c 'import torch, safetensors, transformers, numpy, pytest, psutil, xgboost, sklearn, lightgbm, jax, orbax.checkpoint'
echo "$want" > "$stamp"
echo "e2e venv: ready in $((SECONDS - start)) s"
