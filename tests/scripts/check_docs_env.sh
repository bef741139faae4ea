#!/usr/bin/env bash
# Every environment variable the project reads is in its documentation:
# the names in getenv("...") and env_int("...", ...) calls of the C
# sources, in os.environ / os.getenv of the Python ones, and in the
# ${NAME:-...}, ${NAME:+...}, ${NAME:?...} and ${NAME-...} expansions of
# the shell scripts (scripts/, bench/, .ci/, tests/) must each appear, as
# a word, in README.md or docs/*.md (docs/environment.md is their table).
#
#   check_docs_env.sh SOURCE_DIR
#
# Exit 0 all documented, 1 naming each one that is not.
set -euo pipefail
src=${1:?source dir}
cd "$src"
files() { # the tracked sources of these kinds (git's list where there is one)
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -co --exclude-standard -- "$@"
  else
    local args=() p
    for p in "$@"; do args+=(-o -path "./$p"); done
    # no git (a fresh machine's copy): the tree less what .gitignore keeps out
    # of it (build folders, .venv's packages, .gpu, data, runs)
    find . \( -path './build*' -o -path ./.venv -o -path ./.gpu -o -path ./.git -o -path ./data -o -path ./runs \) -prune -o \
      -type f \( -false "${args[@]}" \) -print | sed 's|^\./||'
  fi
}
names=$(
  {
    files '*.c' '*.h' | xargs -r grep -hoE '(getenv|env_int)\("[A-Za-z_][A-Za-z0-9_]*"' | sed -E 's/.*\("//; s/"$//'
    files '*.py' | xargs -r grep -hoE "(os\.environ\.get\(|os\.environ\[|os\.getenv\()[\"'][A-Za-z_][A-Za-z0-9_]*" |
      sed -E "s/.*[\"']//"
    files '*.sh' '.ci/run' | xargs -r cat -- | grep -vE '^[[:space:]]*#' |
      grep -oE '\$\{[A-Za-z_][A-Za-z0-9_]*:?[-+?]' | sed -E 's/^\$\{//; s/:?[-+?]$//'
  } | sort -u
)
[ -n "$names" ] || { echo "check_docs_env: found no environment variable in the sources (is $src the source folder?)" >&2; exit 1; }
# shell variables a script sets for itself before it expands them are not the environment's
own=$(files '*.sh' '.ci/run' | xargs -r grep -hoE '^[[:space:]]*(local[[:space:]]+)?[a-z_][a-z0-9_]*=' | sed -E 's/^[[:space:]]*(local[[:space:]]+)?//; s/=$//' | sort -u)
missing=()
n=0
for v in $names; do
  grep -qxF "$v" <<<"$own" && continue # a script's own (lower-case) variable
  n=$((n + 1))
  grep -qsw -- "$v" README.md docs/*.md || missing+=("$v")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "check_docs_env: read by the sources but in neither README.md nor docs/: ${missing[*]} (add each to docs/environment.md)" >&2
  exit 1
fi
echo "check_docs_env: $n environment variables, each in the documentation"
