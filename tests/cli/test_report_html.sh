#!/usr/bin/env bash
# The run report in a real browser: headless Chromium renders it (screenshot), its DOM has the four charts,
# and the page logs no console message, script error or blocked request. KEEP_TMP=1 keeps the screenshot.
set -u
BUILD="${DT_BUILD_DIR:?DT_BUILD_DIR must name the build directory}"
DUMP="$BUILD/tests/dump_report"
[ -x "$DUMP" ] || { echo "FAIL: $DUMP is not built" >&2; exit 1; }
if [ -x /usr/bin/chromium ]; then
  CHROMIUM=/usr/bin/chromium
elif command -v chromium >/dev/null 2>&1; then
  CHROMIUM=$(command -v chromium)
else
  echo "skipped: chromium not installed"
  exit 77
fi

tmp=$(mktemp -d)
cleanup() { [ -n "${KEEP_TMP:-}" ] && echo "kept $tmp" >&2 || rm -rf "$tmp"; }
trap cleanup EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run_chromium NAME ARGS...: one headless run with a fresh profile and nothing that
# talks to the network by itself; stdout to $tmp/NAME.out, log to $tmp/NAME.log.
# Returns Chromium's exit status (124: it hung past the 60 s bound).
run_chromium() {
  local name=$1
  shift
  local profile
  profile=$(mktemp -d "$tmp/profile.XXXXXX")
  timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --enable-logging=stderr --v=0 "$@" >"$tmp/$name.out" 2>"$tmp/$name.log" </dev/null
}

# What a page's own troubles look like in Chromium's log: everything the page
# sends to the console comes as "INFO:CONSOLE(line)] "text", source: URL"
# (uncaught exceptions and Content-Security-Policy blocks included); failed
# loads show as net::ERR_*. Our page has no script, so any of these is a fault.
page_problems() { grep -E ':CONSOLE|Uncaught|Content Security Policy|net::ERR_|Failed to load resource' "$1"; }

# ---- the pattern still catches a bad page (else a silent pass would mean nothing) ----
cat >"$tmp/canary.html" <<'EOF'
<!DOCTYPE html><html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'">
</head><body><img src="http://example.invalid/blocked.png" alt="">
<script>console.error("canary console error"); undefinedFunction();</script></body></html>
EOF
run_chromium canary --dump-dom "file://$tmp/canary.html"
if ! page_problems "$tmp/canary.log" | grep -q 'canary console error'; then
  fail "a console error of a test page does not show in Chromium's log; the checks below would miss one"
fi
if ! page_problems "$tmp/canary.log" | grep -q 'blocked.png'; then
  fail "a blocked request of a test page does not show in Chromium's log; the checks below would miss one"
fi

# ---- our report --------------------------------------------------------------------------
if ! "$DUMP" "$tmp/report.html" 2>"$tmp/dump.err"; then
  fail "dump_report failed: $(cat "$tmp/dump.err")"
  exit 1
fi
url="file://$tmp/report.html"

run_chromium shot --window-size=1200,2400 --screenshot="$tmp/shot.png" "$url"
rc=$?
if [ "$rc" -ne 0 ]; then
  fail "chromium --screenshot exited $rc: $(tail -5 "$tmp/shot.log")"
elif [ ! -s "$tmp/shot.png" ]; then
  fail "chromium wrote no screenshot"
else
  magic=$(head -c 8 "$tmp/shot.png" | od -An -tx1 | tr -d ' \n')
  [ "$magic" = 89504e470d0a1a0a ] || fail "screenshot is not a PNG (starts with $magic)"
  # IHDR width and height, big-endian at bytes 16..23: the window size asked for.
  dims=$(od -An -tu1 -j16 -N8 "$tmp/shot.png" | awk '{print ($1*16777216+$2*65536+$3*256+$4) "x" ($5*16777216+$6*65536+$7*256+$8)}')
  [ "$dims" = 1200x2400 ] || fail "screenshot is $dims, expected 1200x2400"
  size=$(wc -c <"$tmp/shot.png")
  # A blank white 1200x2400 PNG is a few KB; charts, tables and text make it far larger.
  [ "$size" -gt 40000 ] || fail "screenshot is only $size bytes: is the page blank?"
fi
if problems=$(page_problems "$tmp/shot.log"); then fail "page problems while rendering: $problems"; fi

run_chromium dom --dump-dom "$url"
rc=$?
if [ "$rc" -ne 0 ]; then
  fail "chromium --dump-dom exited $rc: $(tail -5 "$tmp/dom.log")"
else
  n=$(grep -o '<svg' "$tmp/dom.out" | wc -l)
  [ "$n" -eq 4 ] || fail "rendered DOM has $n <svg> elements, expected 4"
  for title in 'Loss per epoch' 'Accuracy per epoch' 'Training throughput over time' 'Time split per rank' \
    '>Epochs</h2>' '>Summary</h2>' '>Configuration</h2>' 'fashioncnn on fashion-mnist'; do
    grep -qF -- "$title" "$tmp/dom.out" || fail "rendered DOM lacks '$title'"
  done
  # 10 epoch rows, 4 rank bars of 3 parts each
  n=$(grep -o '<tr><td>' "$tmp/dom.out" | wc -l)
  [ "$n" -eq 10 ] || fail "rendered DOM has $n epoch rows, expected 10"
  n=$(grep -o '<rect' "$tmp/dom.out" | wc -l)
  [ "$n" -eq $((4 * 3 + 3)) ] || fail "rendered DOM has $n <rect> elements, expected 15 (bars and legend)"
fi
if problems=$(page_problems "$tmp/dom.log"); then fail "page problems while loading: $problems"; fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "report renders in $("$CHROMIUM" --version 2>/dev/null | head -1): 4 charts, no console or network errors"
