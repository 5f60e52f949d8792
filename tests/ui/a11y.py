"""Accessibility checks in the real browser: axe-core (vendored in tests/ui/vendor/axe-core) run
through Playwright, and the focus ring's contrast measured while tabbing through a page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ui.browser import SHOTS

AXE = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"
SERIOUS = ("serious", "critical")

RUN_AXE = """async (selector) => {
  const root = selector ? document.querySelector(selector) : document;
  const result = await axe.run(root, {resultTypes: ["violations"]});
  return result.violations.map((v) => ({id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 5).map((n) => n.target.join(" "))}));
}"""


async def axe_violations(page: Any, name: str, selector: str | None = None) -> list[dict[str, Any]]:
    """Run axe on the page (or the element ``selector``); the report goes to
    test-output/ui/axe-<name>.json. Returns every violation, of any impact."""
    if not await page.evaluate("() => typeof window.axe === 'object'"):
        # Evaluated through the DevTools protocol: the page's CSP (script-src 'self') does not apply.
        await page.evaluate(AXE.read_text())
    violations: list[dict[str, Any]] = await page.evaluate(RUN_AXE, selector)
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / f"axe-{name}.json").write_text(json.dumps(violations, indent=1))
    return violations


async def assert_no_serious_violations(page: Any, name: str, selector: str | None = None) -> list[dict[str, Any]]:
    violations = await axe_violations(page, name, selector)
    serious = [v for v in violations if v["impact"] in SERIOUS]
    assert not serious, f"axe on {name}: {json.dumps(serious, indent=1)}"
    return violations


FOCUS_RING = """() => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  const parse = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const style = getComputedStyle(el);
  let bg = [255, 255, 255];
  for (let n = el.parentElement; n; n = n.parentElement) {
    const c = parse(getComputedStyle(n).backgroundColor);
    if (c.length >= 3 && (c.length === 3 || c[3] > 0.5)) { bg = c.slice(0, 3); break; }
  }
  const ring = parse(style.outlineColor).slice(0, 3);
  const [a, b] = [lum(ring), lum(bg)].sort((x, y) => y - x);
  const label = el.getAttribute("aria-label") || el.textContent.trim().slice(0, 30) || el.id || el.name || el.tagName;
  return {label, style: style.outlineStyle, width: parseFloat(style.outlineWidth),
          contrast: (a + 0.05) / (b + 0.05)};
}"""


async def focus_rings(page: Any, presses: int) -> list[dict[str, Any]]:
    """Press Tab ``presses`` times; for each focused element, its outline and the contrast of the
    outline against the background it sits on."""
    rings = []
    for _ in range(presses):
        await page.keyboard.press("Tab")
        ring = await page.evaluate(FOCUS_RING)
        if ring is not None:
            rings.append(ring)
    return rings
