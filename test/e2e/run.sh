#!/usr/bin/env bash
# run.sh [PYTEST_ARGS...]: the end-to-end suite against a real ckptfs mount with
# real torch / safetensors / transformers. Prepares the venv (setup_venv.sh;
# $CKPTFS_VENV or <repo>/.venv), then runs pytest in it. Needs root, /dev/fuse and
# Go. Fails if any test fails, is skipped, or if no test ran.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${CKPTFS_VENV:-$repo/.venv}

test -c /dev/fuse || { echo "e2e: /dev/fuse is missing" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "e2e: needs root (mount(2), drop_caches)" >&2; exit 1; }

"$here/setup_venv.sh" "$venv"

cd "$here"
junit=$(mktemp --suffix=.xml)
trap 'rm -f "$junit"' EXIT
start=$SECONDS
rc=0
# pytest.ini holds the options. The suite's own time limit: a hung FUSE request
# must not eat CI's 90 minutes (the daemons get SIGTERM when pytest dies).
timeout --kill-after=30 "${CKPTFS_E2E_TIMEOUT:-1800}" \
	"$venv/bin/python" -m pytest --junitxml="$junit" "$@" || rc=$?
echo "e2e: pytest exited $rc after $((SECONDS - start)) s"
[ "$rc" = 0 ] || exit "$rc"

# pytest exits 5 when nothing was collected, but a filter (-k) can still leave
# zero tests run with exit 0: count what the junit report says ran.
ran=$("$venv/bin/python" - "$junit" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
print(sum(int(s.get("tests", 0)) - int(s.get("skipped", 0)) for s in suites))
PY
)
[ "$ran" -gt 0 ] || { echo "e2e: no test ran" >&2; exit 1; }
