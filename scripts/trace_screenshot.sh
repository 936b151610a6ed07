#!/usr/bin/env bash
# Screenshot a `stepgraph profile` trace (Chrome trace-event JSON) in Catapult's
# trace viewer, the viewer behind chrome://tracing, rendered by headless Chromium.
#
#   scripts/trace_screenshot.sh TRACE.json OUT.png [CATAPULT_DIR]
#
# 1. Catapult's tracing/bin/trace2html builds one standalone HTML page holding
#    the viewer and the trace. CATAPULT_DIR is a catapult checkout; without it a
#    sparse clone of github.com/catapult-project/catapult is made (once) under
#    ~/.cache/stepgraph-catapult.
# 2. Headless Chromium opens that page; a small Python driver speaks the DevTools
#    protocol over --remote-debugging-pipe (no extra Python modules), waits for
#    the import, zooms to the second profiled step (args.repeat == 1; the whole
#    trace if no event has it), selects that step's longest launch so the bottom
#    panel shows its args, and saves a 1600x600 PNG.
# Needs python3, git and chromium; chromium is installed with apt-get when missing.
set -euo pipefail
die() { echo "trace_screenshot: $*" >&2; exit 1; }

[ $# -ge 2 ] && [ $# -le 3 ] || die "usage: $0 TRACE.json OUT.png [CATAPULT_DIR]"
TRACE=$1 OUT=$2 CATAPULT=${3:-$HOME/.cache/stepgraph-catapult}
[ -r "$TRACE" ] || die "cannot read trace $TRACE"
command -v python3 >/dev/null || die "python3 not found"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))["traceEvents"]' "$TRACE" 2>/dev/null \
  || die "$TRACE is not a JSON trace with a traceEvents list"

# Chromium: Debian's package is 'chromium'; take any Chrome already on PATH.
CHROME=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$CHROME" ]; then
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] || die "no chromium on PATH (install chromium, or run as root on Debian/Ubuntu)"
  apt-get install -y chromium >/dev/null || die "apt-get install chromium failed"
  CHROME=$(command -v chromium) || die "chromium still not on PATH after apt-get"
fi

# Catapult: only the directories trace2html reads (tracing/test_data is skipped).
if [ ! -x "$CATAPULT/tracing/bin/trace2html" ]; then
  [ $# -eq 3 ] && die "$CATAPULT is not a catapult checkout (no tracing/bin/trace2html)"
  command -v git >/dev/null || die "git not found (needed to clone catapult)"
  rm -rf "$CATAPULT"
  git clone -q --depth 1 --filter=blob:none --no-checkout \
      https://github.com/catapult-project/catapult "$CATAPULT" || die "cannot clone catapult"
  git -C "$CATAPULT" sparse-checkout set --no-cone '/tracing/' '!/tracing/test_data/' \
      '/common/py_vulcanize/' '/common/py_utils/' '/third_party/polymer/' '/third_party/six/' \
      '/third_party/beautifulsoup4-4.9.3/' '/third_party/html5lib-1.1/' '/third_party/webencodings-0.5.1/' \
      || die "cannot set up catapult's sparse checkout"
  git -C "$CATAPULT" checkout -q || die "cannot check out catapult"
fi

WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
python3 "$CATAPULT/tracing/bin/trace2html" --quiet --title "$(basename "$TRACE")" \
    --output "$WORK/trace.html" "$TRACE" 2>"$WORK/err" || die "trace2html failed: $(tail -n1 "$WORK/err")"

python3 - "$CHROME" "$WORK/trace.html" "$TRACE" "$OUT" <<'PY'
import base64, json, os, subprocess, sys, time
chrome, html, trace, png = sys.argv[1:5]
W, H = 1600, 600

# Zoom window and the launch to select, from the trace itself (times in us).
xs = [e for e in json.load(open(trace))['traceEvents'] if e.get('ph') == 'X']
step = [e for e in xs if (e.get('args') or {}).get('repeat') == 1] or xs
t0 = min(e['ts'] for e in step); t1 = max(e['ts'] + e['dur'] for e in step)
t0, t1 = t0 - 0.04 * (t1 - t0), t1 + 0.04 * (t1 - t0)
pick = max((e for e in step if e.get('cat') == 'launch'), key=lambda e: e['dur'], default=None)

# Chromium reads DevTools commands on fd 3 and answers on fd 4, NUL-separated JSON.
r1, w1 = os.pipe(); r2, w2 = os.pipe()
def fds(): os.dup2(r1, 3); os.dup2(w2, 4)
proc = subprocess.Popen([chrome, '--headless', '--disable-gpu', '--no-sandbox',
                         '--remote-debugging-pipe', f'--window-size={W},{H}', 'about:blank'],
                        pass_fds=(3, 4), preexec_fn=fds, stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
os.close(r1); os.close(w2)
buf, nid, sess = b'', 0, None
def call(method, **params):
    global buf, nid
    nid += 1
    msg = {'id': nid, 'method': method, 'params': params}
    if sess: msg['sessionId'] = sess
    os.write(w1, json.dumps(msg).encode() + b'\0')
    while True:
        while b'\0' not in buf:
            chunk = os.read(r2, 1 << 20)
            if not chunk: sys.exit('trace_screenshot: chromium exited early')
            buf += chunk
        raw, buf = buf.split(b'\0', 1)
        m = json.loads(raw)
        if m.get('id') == nid:
            if 'error' in m: sys.exit(f'trace_screenshot: {method}: {m["error"]}')
            return m['result']
def js(expr):
    r = call('Runtime.evaluate', expression=expr, returnByValue=True)
    if 'exceptionDetails' in r: sys.exit('trace_screenshot: viewer JS error: ' + str(r['exceptionDetails'])[:300])
    return r['result'].get('value')
try:
    target = call('Target.createTarget', url='about:blank')['targetId']
    sess = call('Target.attachToTarget', targetId=target, flatten=True)['sessionId']
    call('Emulation.setDeviceMetricsOverride', width=W, height=H, deviceScaleFactor=1, mobile=False)
    call('Page.navigate', url='file://' + os.path.abspath(html))
    for _ in range(120):  # g_timelineViewEl is trace2html's viewer; .model is set when the import is done
        time.sleep(0.5)
        if js("typeof g_timelineViewEl !== 'undefined' && !!g_timelineViewEl.model"): break
        err = js("(document.querySelector('tr-ui-b-overlay') || {}).textContent || ''")
        if 'rror' in err: sys.exit('trace_screenshot: viewer could not import the trace: ' + err.strip()[:200])
    else:
        sys.exit('trace_screenshot: viewer did not finish importing the trace within 60 s')
    # Wider track-name column (names are long), then rebuild the tracks so it applies.
    js("{ tr.ui.b.constants.HEADING_WIDTH = 370; const m = g_timelineViewEl.model;"
       "  g_timelineViewEl.model = undefined; g_timelineViewEl.model = m; } 0")
    time.sleep(1.5)
    js(f"""(() => {{
      const v = g_timelineViewEl, vp = v.trackView.viewport;
      const dt = new tr.ui.TimelineDisplayTransform();
      dt.set(vp.currentDisplayTransform);
      dt.xSetWorldBounds({t0 / 1000}, {t1 / 1000}, vp.modelTrackContainer.canvas.width);  // viewer works in ms
      vp.setDisplayTransformImmediately(dt);
      const want = {json.dumps(pick and [pick['name'], pick['ts'] / 1000])};
      if (want) for (const t of v.model.getAllThreads()) for (const s of t.sliceGroup.slices)
        if (s.title === want[0] && Math.abs(s.start - want[1]) < 1e-6)
          v.brushingStateController.changeSelectionFromTimeline(new tr.model.EventSet([s]));
      v.$.analysis.style.height = '320px';
    }})()""")
    time.sleep(1.5)
    data = call('Page.captureScreenshot', format='png')['data']
    open(png, 'wb').write(base64.b64decode(data))
finally:
    proc.kill()
print(f'trace_screenshot: wrote {png} ({t0:.0f}-{t1:.0f} us of {os.path.basename(trace)})')
PY
