// Charts drawn as plain SVG (no library, nothing fetched): lines or bars over time, a legend,
// a tooltip per point (an SVG <title>, text), and the data behind each drawn series kept on the
// figure (data-series, JSON as an attribute value) for anyone who reads values, not pixels.
// Colours are presentation attributes: the CSP forbids inline styles.
import { el, svg, fmtTime } from "./ui.js";

const W = 560, H = 170, LEFT = 56, RIGHT = 10, TOP = 10, BOTTOM = 24;
const COLORS = ["#2754c5", "#b42318", "#067647", "#b54708", "#6941c6", "#0e7090", "#c11574", "#4b5563"];

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((m) => m >= v);
}

// xs: the buckets' (or samples') epoch seconds; series: [{name, values}] (null: no value);
// onPick(i): a click on the i-th bucket; picked: the bucket shown as chosen.
export function chart({ id, title, xs, series, format = String, onPick, bars = false, picked = null }) {
  const values = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined);
  const top = niceMax(Math.max(0, ...values));
  const n = xs.length;
  const slot = (W - LEFT - RIGHT) / Math.max(n, 1);
  const xAt = (i) => LEFT + slot * (i + 0.5);
  const yAt = (v) => TOP + (H - TOP - BOTTOM) * (1 - v / top);
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": title });
  for (const frac of [0, 0.5, 1]) {
    const y = yAt(top * frac);
    g.append(svg("line", { x1: LEFT, x2: W - RIGHT, y1: y, y2: y, stroke: "#d8dde4", "stroke-width": 1 }),
      svg("text", { x: LEFT - 6, y: y + 4, "text-anchor": "end", class: "axis" }, format(top * frac)));
  }
  if (n) {
    g.append(svg("text", { x: LEFT, y: H - 6, class: "axis" }, fmtTime(xs[0])),
      svg("text", { x: W - RIGHT, y: H - 6, "text-anchor": "end", class: "axis" }, fmtTime(xs[n - 1])));
  }
  if (picked !== null && picked >= 0 && picked < n) {
    g.append(svg("rect", { x: LEFT + slot * picked, y: TOP, width: slot, height: H - TOP - BOTTOM, fill: "#e8eefb", class: "picked" }));
  }
  series.forEach((s, k) => {
    const color = COLORS[k % COLORS.length];
    if (bars) {
      const w = Math.max(1, slot * 0.8 / series.length);
      s.values.forEach((v, i) => {
        if (v === null || v === undefined) return;
        g.append(svg("rect", { x: LEFT + slot * i + slot * 0.1 + w * k, y: yAt(v), width: w, height: Math.max(0, yAt(0) - yAt(v)), fill: color,
          class: "point", "data-series": s.name, "data-index": i, "data-value": v }, svg("title", {}, `${s.name}, ${fmtTime(xs[i])}: ${format(v)}`)));
      });
      return;
    }
    let path = "";
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) { path += " "; return; }
      path += (path.endsWith(" ") || !path ? "M" : "L") + xAt(i).toFixed(1) + "," + yAt(v).toFixed(1);
    });
    const d = path.trim().split(/\s+/).filter(Boolean).join(" ");
    if (d) g.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 1.5 }));
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      g.append(svg("circle", { cx: xAt(i), cy: yAt(v), r: n > 90 ? 1.5 : 2.5, fill: color, class: "point",
        "data-series": s.name, "data-index": i, "data-value": v }, svg("title", {}, `${s.name}, ${fmtTime(xs[i])}: ${format(v)}`)));
    });
  });
  if (onPick) {
    // a bucket's whole column answers a click, not only its points
    for (let i = 0; i < n; i++) {
      g.append(svg("rect", { x: LEFT + slot * i, y: TOP, width: slot, height: H - TOP - BOTTOM, fill: "transparent", class: "hit",
        "data-index": i, onclick: () => onPick(i) }, svg("title", {}, fmtTime(xs[i]))));
    }
  }
  const legend = el("ul", { class: "legend" }, ...series.map((s, k) => el("li", {},
    svg("svg", { width: 10, height: 10, "aria-hidden": "true" }, svg("rect", { width: 10, height: 10, fill: COLORS[k % COLORS.length] })),
    " " + s.name)));
  return el("figure", { class: "chart", "data-chart": id, "data-series": JSON.stringify({ xs, series }) },
    el("figcaption", {}, title), g, legend);
}
