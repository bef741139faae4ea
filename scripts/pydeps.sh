#!/usr/bin/env bash
# The Python test dependencies — torch, numpy, safetensors, pytest (and
# setuptools, which `pip install ./python` builds with) — in the project's
# own virtual environment, .venv at the repository root (ignored by git;
# `rm -rf .venv` undoes it). Only what is missing is installed, from the
# index pip is configured with on this machine (pip.conf, $PIP_INDEX_URL,
# ...): no other environment is touched. The environment sees the
# packages python3 already has (--system-site-packages), so a machine
# with torch does not fetch it again. Without torch that is ~5 GB
# (torch's CUDA libraries) and a few minutes.
#
#   scripts/pydeps.sh        prints the environment's python on stdout
#
# Exit 0 ready, 1 failed (the reason on stderr).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
py="$venv/bin/python"
want=(torch numpy safetensors pytest setuptools) # import names = pip names

if ! "$py" -c '' 2>/dev/null; then # none yet, or its python3 is gone
  echo "dragon: making the Python test environment $venv" >&2
  python3 -m venv --clear --system-site-packages "$venv" >&2 ||
    { echo "dragon: python3 -m venv $venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
mapfile -t missing < <("$py" - "${want[@]}" <<'EOF'
import importlib.util, sys
for m in sys.argv[1:]:
    if importlib.util.find_spec(m) is None:
        print(m)
EOF
)
if [ ${#missing[@]} -gt 0 ]; then
  echo "dragon: installing ${missing[*]} into $venv (the Python tests' dependencies)" >&2
  "$py" -m pip install --disable-pip-version-check -q "${missing[@]}" >&2 ||
    { echo "dragon: pip install ${missing[*]} into $venv failed" >&2; exit 1; }
  echo "dragon: installed ${missing[*]} in $SECONDS s ($(du -sh "$venv" | cut -f1) in $venv)" >&2
fi
echo "$py"
