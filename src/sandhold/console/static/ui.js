// The console's plumbing: building DOM from text only, calling the API, formatting, navigation.
// Everything shown is put in the page as text (textContent and attribute values, never
// innerHTML): commands, outputs, file names, template names and session labels are model-made
// and must never run as markup. The key lives in this tab's sessionStorage and goes out only in
// an Authorization header; ids travel in request bodies, so no URL carries a key or an id.
export const S = {
  api: document.body.dataset.api, // "gateway", "server" or "edge" (a fleet's)
  key: sessionStorage.getItem("sandhold.console.key"),
  who: null,
  views: [], // [id, label] of the nav
  routes: {}, // view id -> function
  shown: 0, // bumped by each view shown: answers for an older view are dropped
};
export const main = document.getElementById("main");
const nav = document.getElementById("nav");
const SVG = "http://www.w3.org/2000/svg";

function build(e, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.setAttribute("class", v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return e;
}
export const el = (tag, attrs, ...children) => build(document.createElement(tag), attrs, children);
export const svg = (tag, attrs, ...children) => build(document.createElementNS(SVG, tag), attrs, children);

// A view's answer (or failure) that arrives after another view replaced it is dropped (it
// never settles), or it would be appended below the new view's own.
export async function call(path, body) {
  const at = S.shown;
  const dropped = () => new Promise(() => {});
  let r, data;
  try {
    r = await fetch("/console/api/" + path, {
      method: "POST", credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer",
      headers: { "Authorization": "Bearer " + S.key, "Content-Type": "application/json" },
      body: JSON.stringify(body || {}),
    });
    data = await r.json().catch(() => ({}));
  } catch (e) {
    if (at !== S.shown) return dropped();
    throw e;
  }
  if (at !== S.shown) return dropped();
  if (r.status === 401) { go("signOut"); throw new Error(data.message || "not signed in"); }
  if (!r.ok) throw new Error(data.message || ("HTTP " + r.status));
  return data;
}

export const fmtTime = (ts) => ts ? new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "";
export const fmtMs = (ms) => ms === null || ms === undefined ? "" : (ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : ms.toFixed(1) + " ms");
export const fmtAge = (s) => s < 120 ? Math.round(s) + " s" : s < 7200 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h";
export const fmtBytes = (n) => n === null || n === undefined ? "" : n < 1024 ? n + " B" : n < 1048576 ? (n / 1024).toFixed(1) + " KiB" : n < 1073741824 ? (n / 1048576).toFixed(1) + " MiB" : (n / 1073741824).toFixed(2) + " GiB";
export const num = (v, digits) => el("td", { class: "num" }, v === null || v === undefined ? "" : (digits === undefined ? String(v) : Number(v).toFixed(digits)));
export const link = (label, onclick, cls) => el("button", { type: "button", class: "link" + (cls ? " " + cls : ""), onclick }, label);

export function table(headers, rows, caption) {
  return el("table", {}, caption ? el("caption", {}, caption) : "",
    el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, ...rows));
}

// A record as a two-column table: its keys (in order) and their values as text.
export function facts(pairs) {
  return el("table", { class: "facts" }, el("tbody", {}, ...pairs.map(([k, v]) =>
    el("tr", {}, el("th", { scope: "row" }, k), el("td", {}, v instanceof Node ? v : (v === null || v === undefined ? "" : String(v)))))));
}

// A view that is one table of what one API call lists: data[key], a row each.
export async function listing(view, title, path, key, headers, row) {
  setNav(view);
  show(el("h2", {}, title));
  try {
    const data = await call(path, {});
    main.append(table(headers, data[key].map(row)));
  } catch (e) { fail(e); }
}

export function show(...nodes) { S.shown += 1; main.replaceChildren(...nodes); }
export function fail(e, where) { (where || main).append(el("p", { class: "error", role: "alert" }, String(e.message || e))); }

export function setNav(current) {
  nav.replaceChildren(...S.views.map(([id, label]) => el("button", {
    type: "button", "aria-current": id === current ? "page" : null, "data-view": id,
    onclick: () => go(id),
  }, label)));
}
export function go(view, ...args) { return S.routes[view](...args); }

// Text a model wrote, downloaded as a plain-text file (a Blob typed text/plain: never rendered).
export function saveText(name, content) {
  const url = URL.createObjectURL(new Blob([content], { type: "text/plain;charset=utf-8" }));
  const a = el("a", { href: url, download: name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// A guarded action: asks in the page (no window.confirm), then runs; the outcome is shown.
export function guarded(label, question, run) {
  const box = el("span", { class: "action" });
  const ask = el("button", { type: "button", class: "danger", onclick: () => {
    const out = el("span", { class: "muted" });
    const confirmBox = el("span", { class: "confirm", role: "group", "aria-label": "confirm " + label },
      el("span", {}, question + " "),
      el("button", { type: "button", class: "danger", onclick: async () => {
        confirmBox.replaceChildren(out);
        out.textContent = label + "…";
        try { out.textContent = await run(); } catch (e) { out.textContent = ""; fail(e, box); }
      } }, "Confirm " + label.toLowerCase()),
      el("button", { type: "button", onclick: () => { confirmBox.remove(); ask.hidden = false; } }, "Cancel"));
    ask.hidden = true;
    box.append(confirmBox);
  } }, label);
  box.append(ask);
  return box;
}
