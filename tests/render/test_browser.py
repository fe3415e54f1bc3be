"""Pages rendered in a real browser: headless Debian chromium driven over the DevTools protocol
(``--remote-debugging-pipe``, no extra Python package), with name resolution mapped to nowhere.

Checks: circuitsvis views draw (their canvases exist), no request other than the page file and
its own ``data:`` images is attempted, hostile tokens stay text (no script runs, no element is
injected) with and without the page's Content-Security-Policy, and a screenshot of a real report.

Chromium comes from ``scripts/install-chromium.sh`` (the Makefile's test target runs it); when
it is missing the fixture runs that script once, and skips with the reason if it still fails.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from depthprobe.probes.render.attention import MAX_TOKEN_CHARS, View, views_html
from depthprobe.probes.render.html import page
from depthprobe.probes.render.report import RunData, render

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("DEPTHPROBE_CHROMIUM", "/usr/bin/chromium"))
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-default-browser-check",
    "--mute-audio",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--remote-debugging-pipe",
]
LOCAL_SCHEMES = ("file:", "data:")  # the page itself and its embedded images

HOSTILE = [
    "</script><img src=x onerror=alert(1)>",
    '<img src=x onerror="window.__pwned=(window.__pwned||0)+1">',
    "</script><script>window.__pwned=(window.__pwned||0)+1</script>",
    "<!--",
    "<!-- <script>",
    "-->",
    "]]>",
    '" onmouseover="window.__pwned=1" x="',
    "' onfocus='window.__pwned=1' autofocus x='",
    "<svg onload=window.__pwned=1>",
    "<iframe srcdoc='<script>parent.__pwned=1</script>'>",
    "javascript:window.__pwned=1",
    "&lt;b&gt;&amp;",
    "\u2028\u2029",
    "\u202eevil\u202c",
    "\u2066rtl\u2069",
    "\x00\x07\x1b[31m",
    "W" * 5000,
]


# ----------------------------------------------------------------------------------------------
# a minimal DevTools-protocol client over the pipe (fd 3: commands in, fd 4: replies out)
# ----------------------------------------------------------------------------------------------


class Browser:
    def __init__(self, exe: Path) -> None:
        self.profile = tempfile.mkdtemp(prefix="depthprobe-chromium-")
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        shell = f'exec "$@" 3<&{cmd_r} 4>&{res_w}'  # bash: dash only knows one-digit fds
        self.proc = subprocess.Popen(
            ["bash", "-c", shell, "bash", str(exe), *FLAGS, f"--user-data-dir={self.profile}"],
            pass_fds=(cmd_r, res_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(cmd_r)
        os.close(res_w)
        self._out = os.fdopen(cmd_w, "wb", buffering=0)
        self._in = os.fdopen(res_r, "rb", buffering=0)
        self._id = 0
        self._replies: dict[int, dict] = {}
        self.events: list[dict] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while chunk := self._in.read(1 << 16):
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._cv:
                    (self._replies.__setitem__(msg["id"], msg) if "id" in msg else self.events.append(msg))
                    self._cv.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self._id += 1
        i = self._id
        msg = {"id": i, "method": method, "params": params or {}, **({"sessionId": session} if session else {})}
        self._out.write(json.dumps(msg).encode() + b"\0")
        end = time.monotonic() + timeout
        with self._cv:
            while i not in self._replies:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with {self.proc.returncode}")
                if not self._cv.wait(max(0.0, end - time.monotonic())):
                    raise TimeoutError(f"no reply to {method} in {timeout}s")
            reply = self._replies.pop(i)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close", timeout=5)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    """One tab: navigate to a file, wait for a condition, evaluate JS, collect its events."""

    SENTINEL = (
        "window.__pwned = 0; window.alert = window.confirm = window.prompt = "
        "function () { window.__pwned = (window.__pwned || 0) + 1; };"
    )

    def __init__(
        self,
        browser: Browser,
        path: Path,
        *,
        until: str,
        width: int = 1280,
        height: int = 900,
        fragment: str = "",
        timeout: float = 30,
    ) -> None:
        self.browser = browser
        self.target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.send("Target.attachToTarget", {"targetId": self.target, "flatten": True})["sessionId"]
        self._first_event = len(browser.events)
        for domain in ("Network", "Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Page.addScriptToEvaluateOnNewDocument", {"source": self.SENTINEL})
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.send("Page.navigate", {"url": path.resolve().as_uri() + fragment})
        end = time.monotonic() + timeout
        while not self.eval(f"document.readyState === 'complete' && !!({until})"):
            if time.monotonic() > end:
                raise TimeoutError(f"page {path.name} never satisfied {until!r}; state: {self.state()}")
            time.sleep(0.1)

    def send(self, method: str, params: dict | None = None) -> dict:
        return self.browser.send(method, params, self.session)

    def eval(self, expression: str):
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression!r} threw: {res['exceptionDetails']}")
        return res["result"].get("value")

    def state(self) -> dict:
        return self.eval(
            "({views: Object.assign({}, document.body && document.body.dataset), "
            "states: Array.from(document.querySelectorAll('.view')).map(e => e.dataset.state)})"
        )

    def events(self, *methods: str) -> list[dict]:
        return [
            e
            for e in self.browser.events[self._first_event :]
            if e.get("sessionId") == self.session and e["method"] in methods
        ]

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events("Network.requestWillBeSent")]

    def network_requests(self) -> list[str]:
        return [u for u in self.requests() if not u.startswith(LOCAL_SCHEMES)]

    def problems(self) -> list[str]:
        """Exceptions, console errors/warnings and CSP violations the page produced."""
        out = [json.dumps(e["params"]["exceptionDetails"])[:300] for e in self.events("Runtime.exceptionThrown")]
        out += [
            e["params"]["entry"]["text"][:300]
            for e in self.events("Log.entryAdded")
            if e["params"]["entry"]["level"] in ("error", "warning")
        ]
        out += [
            json.dumps(e["params"]["args"])[:300]
            for e in self.events("Runtime.consoleAPICalled")
            if e["params"]["type"] in ("error", "warning", "assert")
        ]
        out += ["dialog: " + e["params"]["message"] for e in self.events("Page.javascriptDialogOpening")]
        return out

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"]))
        return path

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})


def _find_chromium() -> Path | str:
    """The chromium binary, installing it with the project script when missing; else why not."""
    if CHROMIUM.exists():
        return CHROMIUM
    script = REPO / "scripts" / "install-chromium.sh"
    try:
        res = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"chromium is not installed and {script.name} could not run: {exc}"
    if CHROMIUM.exists():
        return CHROMIUM
    tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
    return f"chromium is not installed and {script.name} failed ({tail[0]}); run it as root"


@pytest.fixture(scope="module")
def browser():
    found = _find_chromium()
    if isinstance(found, str):
        pytest.skip(found)
    b = Browser(found)
    try:
        b.send("Browser.getVersion", timeout=60)
        yield b
    finally:
        b.close()


# ----------------------------------------------------------------------------------------------
# pages
# ----------------------------------------------------------------------------------------------

DRAWN = "document.body.dataset.viewsDone === '1'"


def _pattern(heads: int, n: int, causal: bool, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((heads, n, n)) * 2  # [head, query, key]
    if causal:
        x = np.where(np.tril(np.ones((n, n), bool)), x, -np.inf)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _hostile_run(tmp_path: Path) -> RunData:
    """A run with hostile strings in every place a report shows text from a run."""
    import pandas as pd

    evil = HOSTILE[0]
    tokens = ["[CLS]", *HOSTILE, "[SEP]"]
    views = [
        {
            "title": f"view {evil}",
            "tokens": tokens,
            "pattern": _pattern(2, len(tokens), c, i).tolist(),
            "heads": [f"h{evil}", "h<!--"],
            "causal": c,
        }
        for i, c in enumerate([False, True])
    ]
    rows = [
        {"model": evil, "task": "t", "layer": layer, "head": head, "metric": f"m{evil}", "value": layer + head / 10}
        for layer in range(2)
        for head in range(3)
    ]
    plot = (
        "<svg xmlns='http://www.w3.org/2000/svg' width='40' height='20'><script>parent.__pwned=1</script>"
        "<image href='http://example.com/x.png' width='10' height='10'/><rect width='40' height='20' "
        "fill='teal' onload='parent.__pwned=1'/></svg>"
    )
    return RunData(
        summary={
            "task": f"task {evil}",
            "model": f"model {HOSTILE[1]}",
            "notes": HOSTILE[:6],
            "summary": [{"metric": h, evil: h} for h in HOSTILE[:5]],
            "headline": {evil: HOSTILE[3]},
            "heatmaps": [{"title": evil, "metric": f"m{evil}", "where": {}}],
        },
        scores=pd.DataFrame(rows),
        views=views,
        plots={f"plot {evil}": plot},
        manifest={"model": {"resolved": evil, "causal": False, "n_layers": 2, "n_heads": 3}, "created": evil},
        files=[(f"{evil}.txt", 3)],
    )


# ----------------------------------------------------------------------------------------------
# tests
# ----------------------------------------------------------------------------------------------


def test_views_draw_with_circuitsvis(browser, tmp_path):
    views = [
        View("encoder", [f"w{i}" for i in range(10)], _pattern(3, 10, False), ["a", "b", "c"], False),
        View("decoder", [f"w{i}" for i in range(8)], _pattern(2, 8, True), ["x", "y"], True),
        View("longer", [f"w{i}" for i in range(130)], _pattern(4, 130, False), list("pqrs"), False),
    ]
    body, payloads = views_html(views)
    assert [p["mode"] for p in payloads] == ["heads", "heads", "pattern"]
    path = _write(tmp_path, "views.html", page("views", body, payloads))
    tab = Page(browser, path, until=DRAWN, fragment="#all")
    try:
        assert tab.state()["states"] == ["drawn"] * 3
        # AttentionHeads: one thumbnail canvas per head plus the zoomed head; pattern mode: one canvas
        counts = tab.eval(
            "Array.from(document.querySelectorAll('.view')).map(e => e.querySelectorAll('canvas').length)"
        )
        assert counts == [3 + 1, 2 + 1, 1]
        assert tab.eval("document.querySelector('#dp-view-0 h4').textContent") == "a"  # head labels
        assert tab.eval("document.querySelectorAll('.toks')[0].textContent") == "".join(f"w{i}" for i in range(10))
        assert tab.eval("document.querySelectorAll('#dp-view-2 .heads button').length") == 4
        tab.eval("document.querySelectorAll('#dp-view-2 .heads button')[2].click()")
        assert tab.eval("document.querySelector('#dp-view-2 [aria-pressed=true]').textContent") == "r"
        assert tab.eval("document.querySelectorAll('#dp-view-2 canvas').length") == 1
        assert tab.eval("document.body.dataset.viewsDrawn") == "3"
        assert tab.problems() == []
        assert tab.network_requests() == []
    finally:
        tab.close()


def test_long_views_draw_one_pixel_per_cell(browser, tmp_path):
    n = 300
    pattern = np.zeros((2, n, n))
    pattern[0, np.arange(n), np.arange(n)] = 1.0  # head 0 attends to itself
    pattern[1, :, 0] = 1.0  # head 1 attends to the first token
    body, payloads = views_html([View("long", [f"t{i}" for i in range(n)], pattern, ["self", "first"], True)])
    assert payloads[0]["mode"] == "raster"
    tab = Page(browser, _write(tmp_path, "long.html", page("long", body, payloads)), until=DRAWN)
    pixel = (
        "(q, k) => Array.from(document.querySelector('#dp-view-0 canvas').getContext('2d')"
        ".getImageData(k, q, 1, 1).data.slice(0, 3))"
    )
    try:
        assert tab.eval(
            "[document.querySelector('#dp-view-0 canvas').width, document.querySelector('#dp-view-0 canvas').height]"
        ) == [n, n]
        assert tab.eval(f"({pixel})(5, 5)") == [68, 20, 220]  # the largest value: darkest
        assert tab.eval(f"({pixel})(5, 0)") == [255, 255, 255]  # zero: white
        assert tab.eval(f"({pixel})(5, 6)") == [215, 215, 215]  # causal: the upper triangle is masked
        tab.eval("document.querySelectorAll('#dp-view-0 .heads button')[1].click()")
        assert tab.eval(f"({pixel})(5, 0)") == [68, 20, 220] and tab.eval(f"({pixel})(5, 5)") == [255, 255, 255]
        tip = tab.eval("""(() => { const c = document.querySelector('#dp-view-0 canvas'), r = c.getBoundingClientRect();
            c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + r.width * 0.5 / 300,
                                                         clientY: r.top + r.height * 7.5 / 300}));
            return document.querySelector('#dp-view-0 .tip').textContent; })()""")
        assert tip == "first: t7 (7) attends to t0 (0): 1.0000"
        # (the test's own pixel reads draw a performance hint about willReadFrequently)
        assert [p for p in tab.problems() if "willReadFrequently" not in p] == []
        assert tab.network_requests() == []
    finally:
        tab.close()


def test_views_draw_lazily_when_scrolled_to(browser, tmp_path):
    views = [View(f"v{i}", ["a", "b", "c"], _pattern(1, 3, False, i), ["h"], False) for i in range(12)]
    body, payloads = views_html(views)
    path = _write(tmp_path, "lazy.html", page("lazy", body, payloads))
    tab = Page(browser, path, until="document.body.dataset.viewsDrawn >= '1'", height=700)
    try:
        time.sleep(0.5)
        states = tab.state()["states"]
        assert states[0] == "drawn" and states[-1] == "waiting"  # far below the fold: not drawn yet
        tab.eval("document.getElementById('dp-draw-all').click()")
        end = time.monotonic() + 60
        while tab.eval(DRAWN) is not True and time.monotonic() < end:
            time.sleep(0.1)
        assert tab.state()["states"] == ["drawn"] * 12
    finally:
        tab.close()


def test_detector_sees_network_requests(browser, tmp_path):
    """The check below can fail: a page that does reach out is caught (name resolution is off)."""
    path = _write(
        tmp_path,
        "leaky.html",
        "<!doctype html><img src='http://depthprobe.invalid/x.png'>"
        "<script>fetch('https://cdn.depthprobe.invalid/a.js').catch(function(){})</script>",
    )
    tab = Page(browser, path, until="true")
    try:
        time.sleep(0.3)
        assert {"http://depthprobe.invalid/x.png", "https://cdn.depthprobe.invalid/a.js"} <= set(tab.network_requests())
    finally:
        tab.close()


@pytest.mark.parametrize("csp", [True, False], ids=["with-csp", "escaping-alone"])
def test_hostile_text_stays_text(browser, tmp_path, csp):
    html = render(_hostile_run(tmp_path))
    if not csp:  # the escaping must hold on its own, without the policy's second line of defence
        start = html.index("<meta http-equiv='Content-Security-Policy'")
        html = html[:start] + html[html.index(">", start) + 1 :]
        assert "Content-Security-Policy" not in html
    path = _write(tmp_path, "hostile.html", html)
    tab = Page(browser, path, until=DRAWN, fragment="#all")
    try:
        time.sleep(0.3)
        assert tab.eval("window.__pwned") == 0 and tab.eval("parent.__pwned") == 0
        assert tab.state()["states"] == ["drawn", "drawn"]
        # only the page's own elements: 3 scripts, data: images (heatmap + plot), no iframe/svg/handlers
        assert tab.eval("document.scripts.length") == 3
        assert tab.eval("Array.from(document.images).every(i => i.src.startsWith('data:image/svg+xml;base64,'))")
        assert tab.eval("document.images.length") == 2
        assert tab.eval("document.querySelectorAll('iframe, object, embed, body > svg').length") == 0
        assert (
            tab.eval(
                "Array.from(document.querySelectorAll('*')).filter(e => "
                "Array.from(e.attributes).some(a => a.name.startsWith('on'))).length"
            )
            == 0
        )
        text = tab.eval("document.body.innerText")
        for token in HOSTILE[:6]:  # notes, table cells: verbatim text
            assert token in text, token
        # tokens: verbatim in each view's token list and in the props circuitsvis received
        shown = tab.eval("Array.from(document.querySelectorAll('.toks')[0].children).map(e => e.textContent)")
        props = tab.eval("JSON.parse(document.getElementById('dp-views-data').textContent)[0].tokens")
        assert shown == props
        assert shown[1:14] == HOSTILE[:13]
        assert shown[15:17] == ["<U+202E>evil<U+202C>", "<U+2066>rtl<U+2069>"]  # bidi controls made visible
        assert shown[-2] == "W" * (MAX_TOKEN_CHARS - 12) + f"…(+{5000 - MAX_TOKEN_CHARS + 12} chars)"
        assert tab.eval("document.querySelector('#dp-view-0 h4').textContent") == "h" + HOSTILE[0]
        assert tab.problems() == []
        assert tab.network_requests() == []
    finally:
        tab.close()


@pytest.mark.slow
def test_real_report_in_browser_and_screenshot(browser, tmp_path, minilm):
    """A real minilm attention-stats run: the report loads offline; screenshot kept for the docs.

    DEPTHPROBE_UPDATE_SCREENSHOT=1 copies it to docs/report-screenshot.png.
    """
    from PIL import Image

    from depthprobe.probes import run

    result = run(minilm, "attention-stats", limit=8)
    run_dir = result.save(tmp_path / "run")
    tab = Page(browser, run_dir / "report.html", until="document.images.length > 0", height=1400)
    try:
        assert tab.eval("Array.from(document.images).every(i => i.complete && i.naturalWidth > 100)")
        assert tab.eval("document.querySelectorAll('figure.heatmap img').length") == 7
        # drawn at least at their own size: the heatmaps' 11 px text is not shrunk (#49)
        assert tab.eval(
            "Array.from(document.querySelectorAll('figure.heatmap img')).every(i => "
            "i.getBoundingClientRect().width >= i.naturalWidth - 0.5)"
        )
        assert tab.eval("document.body.firstElementChild.tagName") == "H1"
        assert tab.eval("document.querySelector('h1').textContent") == "depthprobe: attention-stats on minilm"
        assert tab.problems() == []
        assert tab.network_requests() == []
        shot = tab.screenshot(tmp_path / "report.png")
    finally:
        tab.close()
    with Image.open(shot) as img:
        assert img.size == (1280, 1400)
        colours = len(np.unique(np.asarray(img.convert("RGB").resize((320, 350))).reshape(-1, 3), axis=0))
    assert colours > 200  # heatmaps drawn, not a blank page
    if os.environ.get("DEPTHPROBE_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, REPO / "docs" / "report-screenshot.png")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_notebook_view_borrows_the_bundle_from_an_earlier_one(browser, tmp_path, monkeypatch):
    """#35.4: the second output carries no bundle; it runs the first one's (same hash) and draws."""
    from depthprobe import probes
    from depthprobe.probes.render import html as page_html

    monkeypatch.setitem(page_html._NOTEBOOK, "carrier", None)
    model = probes.load("native:layers=2,d_model=16,heads=2,d_vocab=12,n_ctx=16", device="cpu")
    first, second = probes.view(model, [1, 2, 3, 4], layers=[0]), probes.view(model, [4, 3, 2], layers=[1])
    outputs = [first._repr_html_(), second._repr_html_()]
    assert len(outputs[1]) < len(outputs[0]) / 10
    path = _write(tmp_path, "notebook.html", "<!doctype html><html><body>" + "".join(outputs) + "</body></html>")
    frame = "document.querySelectorAll('iframe')[{}].contentDocument.body.dataset"
    done = " && ".join(f"({frame.format(i)}.viewsDone === '1')" for i in (0, 1))
    tab = Page(browser, path, until=done, height=2400)
    try:
        assert tab.eval(f"{frame.format(1)}.viewsDrawn") == "1"
        assert tab.eval("document.querySelectorAll('iframe')[1].contentDocument.querySelectorAll('canvas').length") > 0
        assert tab.network_requests() == []
    finally:
        tab.close()
