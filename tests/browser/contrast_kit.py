"""WCAG contrast of the page's text, measured in the browser (issue #36): every visible element with text of its
own, its colour against the background it actually sits on (ancestors' backgrounds composed), ≥ 4.5:1, or 3:1 for
large text (≥ 24 px, or ≥ 18.66 px bold).  Disabled controls are exempt, as WCAG exempts inactive components;
charts are checked by their own colours, not here."""
from __future__ import annotations

LOW_CONTRAST_JS = """
() => {
  const parse = (c) => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const over = (top, bottom) => { const a = top[3]; return [0, 1, 2].map(i => top[i] * a + bottom[i] * (1 - a)).concat([1]); };
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const background = (el) => { const layers = [];
    for (let e = el; e; e = e.parentElement) { const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; } }
    let bg = [255, 255, 255, 1]; for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg); return bg; };
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    if (el.closest('svg, .js-plotly-plot, script, style, [aria-hidden=true], .toast-body')) continue;
    const own = Array.from(el.childNodes).filter(n => n.nodeType === 3 && n.textContent.trim()).map(n => n.textContent.trim()).join(' ');
    if (!own) continue;
    const rect = el.getBoundingClientRect(); const st = getComputedStyle(el);
    if (rect.width === 0 || rect.height === 0 || st.visibility === 'hidden' || st.display === 'none') continue;
    if (el.closest('[disabled], :disabled')) continue;
    let opacity = 1; for (let e = el; e; e = e.parentElement) opacity *= Number(getComputedStyle(e).opacity);
    if (opacity === 0) continue;
    const bg = background(el); let fg = parse(st.color); if (!fg) continue;
    fg = over([fg[0], fg[1], fg[2], fg[3] * opacity], bg);
    const l1 = lum(fg), l2 = lum(bg); const ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
    const size = parseFloat(st.fontSize); const bold = Number(st.fontWeight) >= 700;
    const need = (size >= 24 || (size >= 18.66 && bold)) ? 3 : 4.5;
    if (ratio < need) out.push({text: own.slice(0, 40), ratio: Math.round(ratio * 100) / 100, need, color: st.color,
                                tag: el.tagName.toLowerCase(), cls: String(el.className).slice(0, 40)});
  }
  return out;
}
"""


def low_contrast(page) -> list[dict]:
    """The visible texts whose contrast is below WCAG AA on the current page."""
    return page.evaluate(LOW_CONTRAST_JS)
