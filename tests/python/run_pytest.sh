#!/usr/bin/env bash
# CTest entry of the Python package tests: runs pytest on tests/python with the first interpreter that
# has numpy and pytest ($DS4R_PYTHON, Debian's /usr/bin/python3 with python3-numpy / python3-pytest, then
# python3 on PATH, which may be a pyenv one without them). Exit 77 (CTest: skipped) with a message when
# none has them.
#   tests/python/run_pytest.sh BINARY [pytest args...]
set -u
here="$(cd "$(dirname "$0")" && pwd)"
export DS4REPLAY_BIN="$1"
shift
for py in ${DS4R_PYTHON:-} /usr/bin/python3 python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c "import numpy, pytest" >/dev/null 2>&1; then
    export PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONDONTWRITEBYTECODE=1
    exec "$py" -m pytest -q -p no:cacheprovider "$here" "$@"
  fi
done
echo "SKIPPED: no python3 with numpy and pytest (apt-get install python3-numpy python3-pytest, or set DS4R_PYTHON)" >&2
exit 77
