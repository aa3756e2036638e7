#!/usr/bin/env bash
# make install + pkg-config: a user's C program (examples/train_mlp.c) compiles
# and links against the installed libdtrain, and runs up to its first real error.
set -u
build=${DT_BUILD_DIR:?} src=${DT_SOURCE_DIR:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v pkg-config >/dev/null || { echo "pkg-config not installed: skipped"; exit 77; }

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || fail "install: $(cat "$tmp/install.log")"
[ -f "$tmp/prefix/include/dtrain/dtrain.h" ] || fail "headers not installed"
[ -x "$tmp/prefix/bin/dtrain" ] || fail "dtrain not installed"
# The installed program finds the installed library by itself (rpath $ORIGIN/../lib).
"$tmp/prefix/bin/dtrain" version >"$tmp/version" 2>&1 || fail "installed dtrain does not run: $(cat "$tmp/version")"
pc=$(find "$tmp/prefix" -name dtrain.pc | head -1)
[ -n "$pc" ] || fail "dtrain.pc not installed"
libdir=$(dirname "$(dirname "$pc")")
export PKG_CONFIG_PATH=$(dirname "$pc")
# pkg-config must point at the prefix we installed to, not where it was configured.
[ "$(cd "$(pkg-config --variable=prefix dtrain)" && pwd -P)" = "$(cd "$tmp/prefix" && pwd -P)" ] \
  || fail "dtrain.pc prefix: $(pkg-config --variable=prefix dtrain)"
cc -std=c17 -Wall -Wextra -Werror "$src/examples/train_mlp.c" $(pkg-config --cflags --libs dtrain) \
  -o "$tmp/train_mlp" 2>"$tmp/cc.log" || fail "example does not build against the install: $(cat "$tmp/cc.log")"
# With no dataset where it looks, the program must stop with the library's clear error.
out=$(cd "$tmp" && DT_DATA_DIR="$tmp/none" LD_LIBRARY_PATH="$libdir" ./train_mlp 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "example exit code $rc, expected 1: $out"
echo "$out" | grep -q "not found" || fail "example error does not say what is missing: $out"
echo "1 passed, 0 failed"
