"""The documentation site, rendered: the reference pages' tables wrap to fit their
column on a desktop, and no table is cut off, wider than its column without a way to
scroll (the readthedocs theme kept every cell on one line, pushing the spec reference's
meaning column out of view; docs/css/tables.css wraps cells, and a table of numbers too
wide to wrap scrolls). The site is built with mkdocs and laid out by a headless Chromium
(Debian's `chromium`, which .ci/run installs) at a desktop and a narrow width."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("reference/spec", "reference/cli", "reference/gpus", "reference/models",
         "json-schema", "concepts", "search", "inference", "")
"""Pages with wide tables ("" is the home page)."""
WIDTHS = (1280, 900)

if importlib.util.find_spec("mkdocs") is None or not (ROOT / "mkdocs.yml").is_file():
    pytest.skip("needs mkdocs (the docs extra) and the docs", allow_module_level=True)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("needs Debian's chromium (.ci/run installs it)", allow_module_level=True)

PROBE = """<!doctype html><html><body><pre id="result">pending</pre><script>
const frames = %s;
const found = {};
let left = frames.length;
for (const [page, width] of frames) {
  const frame = document.createElement('iframe');
  frame.style.width = width + 'px'; frame.style.height = '600px';
  frame.onload = () => {
    const doc = frame.contentDocument;
    const tables = [...doc.querySelectorAll('[role=main] table')];
    // Wider: its content is wider than the column it sits in (a reader must scroll to
    // see its last columns). Cut off: wider, and it does not scroll.
    const wider = t => t.scrollWidth > t.parentElement.clientWidth + 1;
    const cut = t => wider(t) &&
      !['auto', 'scroll'].includes(frame.contentWindow.getComputedStyle(t).overflowX);
    found[page + '@' + width] = [tables.length, tables.filter(wider).length,
                                 tables.filter(cut).length];
    if (--left === 0) document.getElementById('result').textContent = JSON.stringify(found);
  };
  frame.src = page + 'index.html';
  document.body.appendChild(frame);
}
</script></body></html>"""


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                    "--site-dir", str(site)], cwd=ROOT, check=True)
    frames = [[f"{page}/" if page else "", width] for page in PAGES for width in WIDTHS]
    (site / "probe.html").write_text(PROBE % json.dumps(frames), encoding="utf-8")
    shown = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--allow-file-access-from-files", "--window-size=1400,900",
         "--virtual-time-budget=20000", "--dump-dom", (site / "probe.html").as_uri()],
        capture_output=True, text=True, timeout=120, check=True).stdout
    match = re.search(r'<pre id="result">(.*?)</pre>', shown, re.S)
    assert match is not None and match.group(1) != "pending", shown[-2000:]
    return json.loads(match.group(1))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p or "index")
def test_no_table_is_cut_off(layout, page):
    for width in WIDTHS:
        tables, _wider, cut = layout[f"{page}/@{width}" if page else f"@{width}"]
        assert tables > 0, f"{page or 'index'}: no table found to check"
        assert cut == 0, f"{page or 'index'} at {width} px: {cut} of {tables} tables are cut off"


@pytest.mark.parametrize("page", [p for p in PAGES if p.startswith("reference/")]
                         + ["json-schema"])
def test_reference_tables_wrap_on_a_desktop(layout, page):
    """The reference pages' tables of keys, types and meanings fit the column at
    1280 px: their prose wraps, so the last column is in view without scrolling."""
    tables, wider, _cut = layout[f"{page}/@{WIDTHS[0]}"]
    assert wider == 0, f"{page}: {wider} of {tables} tables need scrolling at {WIDTHS[0]} px"
