#!/usr/bin/env bash
# Runs the shell commands of README.md as a user would type them, so the
# README cannot name a command, a flag or a file that does not work.
#
#   check_readme_sh.sh BUILD_DIR SOURCE_DIR
#
# Every fenced block of README.md carries an info string, one of:
#   sh        commands that need no GPU: run here, in the order of the
#             README, by one bash (set -euo pipefail) in a scratch folder
#             that stands for the repository: build/ is BUILD_DIR, python/
#             a copy, the source's other entries links to it, and what the
#             commands write (runs/, kernels/, the kernel cache, what pip
#             installs) stays in the scratch folder;
#   sh gpu    commands that need an NVIDIA GPU: not run (counted);
#   sh fresh  the quick start (scripts/setup.sh, scripts/test.sh), which
#             set up a machine: run on a fresh Debian root by
#             scripts/check_fresh.sh, which this test holds to running
#             each of them;
#   text, python, c
#             output, Python (python/tests runs it) and C (install_readme
#             compiles it): not run here.
# Any other fence, or one without an info string, fails the test: a new
# block says which kind it is.
#
# pip installs into a virtual environment in the scratch folder (from
# .gpu/wheels where they are, as check_python takes them). What the commands need beyond the build — the built-in corpus
# (data/shakespeare.txt or $DRAGON_CORPUS), gnuplot, python3's venv — is a
# skip (exit 77) where missing, a failure with DRAGON_REQUIRE_DEPS=1 (as
# scripts/test.sh runs it).
set -uo pipefail
build=$(cd "${1:?build dir}" && pwd)
src=$(cd "${2:?source dir}" && pwd)
readme="$src/README.md"
work=$(mktemp -d /tmp/dragon-readme-sh-XXXXXX)
trap 'rm -rf "$work"' EXIT

missing() { # what is missing, the fix
  if [ "${DRAGON_REQUIRE_DEPS:-0}" = 1 ]; then
    echo "check_readme_sh: $1 (DRAGON_REQUIRE_DEPS=1: not a skip); $2" >&2
    exit 1
  fi
  echo "skipped: $1"
  exit 77
}

# Split README.md into its blocks: $work/sh (the commands of the sh blocks,
# one a line, continuation lines joined, each after the README line it
# starts on as "@LINE"), $work/fresh (the sh fresh commands), and a count
# of the GPU ones; a fence of another kind is an error.
awk -v dir="$work" '
  function command(line) { sub(/[ \t]+#.*$/, "", line); sub(/^[ \t]*#.*$/, "", line); return line }
  BEGIN { inside = 0; gpu = 0; bad = 0 }
  {
    line = $0
    if (!inside) {
      if (line ~ /^[ \t]*(```|~~~)/) {
        t = line; sub(/^[ \t]*/, "", t); fence = substr(t, 1, 3)
        info = substr(t, 4); sub(/^[`~]*/, "", info); gsub(/^[ \t]+|[ \t]+$/, "", info)
        if (info == "sh") kind = "sh"
        else if (info == "sh gpu") kind = "gpu"
        else if (info == "sh fresh") kind = "fresh"
        else if (info == "text" || info == "python" || info == "c") kind = "skip"
        else {
          printf "README.md:%d: %s: tag it sh (run by this test), sh gpu (needs a GPU), sh fresh (the quick start) or text, python, c\n", NR, info == "" ? "a block without a tag" : "a block tagged \"" info "\"" > "/dev/stderr"
          bad = 1; kind = "skip"
        }
        inside = 1; pending = ""; next
      }
      next
    }
    t = line; sub(/^[ \t]*/, "", t)
    if (substr(t, 1, 3) == fence && t ~ /^(```+|~~~+)[ \t]*$/) { inside = 0; next }
    if (kind == "skip") next
    if (pending == "") start = NR
    if (pending != "") sub(/^[ \t]+/, " ", line)
    if (line ~ /\\$/) { sub(/[ \t]*\\$/, "", line); pending = pending line; next }
    cmd = command(pending line); pending = ""
    if (cmd ~ /^[ \t]*$/) next
    if (kind == "sh") printf "@%d\n%s\n", start, cmd >> (dir "/sh")
    else if (kind == "fresh") printf "%d\t%s\n", start, cmd >> (dir "/fresh")
    else gpu++
  }
  END {
    if (inside) { print "README.md: a block is not closed" > "/dev/stderr"; bad = 1 }
    print gpu > (dir "/gpu")
    exit bad
  }
' "$readme" || exit 1
touch "$work/sh" "$work/fresh"

failed=0
# The quick start: scripts/check_fresh.sh runs each command in its fresh root.
nfresh=0
while IFS=$'\t' read -r at cmd; do
  nfresh=$((nfresh + 1))
  cmd=${cmd%"${cmd##*[![:space:]]}"} # trailing blanks off
  if ! grep -qF "in_root $cmd " "$src/scripts/check_fresh.sh"; then
    echo "check_readme_sh: README.md:$at: '$cmd' is a quick-start command (sh fresh) that scripts/check_fresh.sh does not run" >&2
    failed=$((failed + 1))
  fi
done < "$work/fresh"
[ "$nfresh" -gt 0 ] || { echo "check_readme_sh: README.md has no quick start (a block tagged sh fresh)" >&2; failed=$((failed + 1)); }

# What the commands need beyond the build.
corpus="${DRAGON_CORPUS:-$src/data/shakespeare.txt}"
if grep 'dragon train' "$work/sh" | grep -qv -- '--data'; then
  [ -f "$corpus" ] || missing "no built-in corpus at $corpus (README.md trains on it)" "run scripts/corpus.sh"
fi
if grep -q 'data/shakespeare.txt' "$work/sh"; then
  [ -f "$src/data/shakespeare.txt" ] || missing "no data/shakespeare.txt (README.md reads it)" "run scripts/corpus.sh"
fi
if grep -q 'dragon plot' "$work/sh"; then
  command -v gnuplot >/dev/null || missing "no gnuplot (README.md runs dragon plot)" "scripts/deps.sh installs gnuplot-nox"
fi

# The scratch repository.
repo="$work/repo"
mkdir "$repo"
ln -s "$build" "$repo/build"
for f in "$src"/*; do
  name=$(basename "$f")
  case "$name" in
    build | build-* | runs | dragon-kernels | kernels) continue ;;
    python) cp -R "$f" "$repo/python" ;; # pip builds in the folder it is given: a copy
    *) ln -s "$f" "$repo/$name" ;;
  esac
done
export DRAGON_CACHE_DIR="$work/cache"
[ -f "$corpus" ] && export DRAGON_CORPUS="$corpus"
# pip installs into a virtual environment of the scratch folder's own,
# without build isolation where its setuptools builds wheels by itself
if grep -q 'pip install' "$work/sh"; then
  python3 -m venv "$work/venv" >/dev/null 2>&1 ||
    missing "python3 cannot make a virtual environment (README.md runs pip install)" "apt-get install python3-venv"
  export PATH="$work/venv/bin:$PATH" VIRTUAL_ENV="$work/venv" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
  # pip reads a false PIP_NO_BUILD_ISOLATION as --no-build-isolation
  python3 -c 'import setuptools.command.bdist_wheel' 2>/dev/null && export PIP_NO_BUILD_ISOLATION=0
fi
if [ -d "$src/.gpu/wheels" ]; then
  export PIP_FIND_LINKS="$src/.gpu/wheels"
  [ "${DRAGON_REQUIRE_GPU:-0}" = 1 ] && export PIP_NO_INDEX=1
fi

# One bash runs them all, in order; the README line of each goes first.
# shellcheck disable=SC2016 # $at and $cmd are the generated script's
{
  echo 'set -euo pipefail'
  echo 'trap '\''echo "check_readme_sh: README.md:$at: exit $?: $cmd" >&2'\'' ERR'
  while IFS= read -r l; do
    if [[ "$l" == @* ]]; then
      at=${l#@}
    else
      printf 'at=%s; cmd=%q\nprintf "\\n== README.md:%%s: %%s\\n" "$at" "$cmd"\n%s\n' "$at" "$l" "$l"
    fi
  done < "$work/sh"
} > "$work/run.sh"
n=$(grep -c '^printf "\\n== README' "$work/run.sh" || true)
if [ "$n" -eq 0 ]; then
  echo "check_readme_sh: README.md has no shell commands that run without a GPU (a block tagged sh)" >&2
  failed=$((failed + 1))
elif ! (cd "$repo" && bash "$work/run.sh") > "$work/log" 2>&1; then
  tail -n 40 "$work/log" >&2
  failed=$((failed + 1))
else
  grep '^== README' "$work/log" | sed 's/^== /check_readme_sh: ran /'
fi
echo "check_readme_sh: $n commands run, $(cat "$work/gpu") that need a GPU not run, $nfresh quick-start commands held to scripts/check_fresh.sh; $failed failed"
[ "$failed" -eq 0 ]
