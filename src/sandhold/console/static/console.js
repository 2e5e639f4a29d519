"use strict";
// The Sandhold console. Everything it shows is put in the page as text (textContent, never
// innerHTML): commands, outputs, file names, tool arguments and session labels are model-made
// and must never run as markup. The key lives in this tab's sessionStorage and goes out only in
// an Authorization header; ids travel in request bodies, so no URL carries a key or a session.
(() => {
  const api = document.body.dataset.api; // "gateway", "server" or "edge" (a fleet's)
  const main = document.getElementById("main");
  const nav = document.getElementById("nav");
  const STORE = "sandhold.console.key";
  let key = sessionStorage.getItem(STORE);
  let who = null;
  const VIEWS = {
    gateway: [["overview", "Overview"], ["sessions", "Sessions"], ["failures", "Failures"], ["sandboxes", "Sandboxes"]],
    server: [["sandboxes", "Sandboxes"]],
    edge: [["hosts", "Hosts"], ["sandboxes", "Sandboxes"]],
  }[api];
  const RANGES = [["1h", 3600], ["24h", 86400], ["7d", 604800], ["30d", 2592000]];
  let range = { since: null, until: null, span: 86400 };

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
    return e;
  }

  // A view's answer (or failure) that arrives after another view replaced it is dropped (it
  // never settles), or it would be appended below the new view's own.
  let shown = 0;
  async function call(path, body) {
    const at = shown;
    const dropped = () => new Promise(() => {});
    let r, data;
    try {
      r = await fetch("/console/api/" + path, {
        method: "POST", credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer",
        headers: { "Authorization": "Bearer " + key, "Content-Type": "application/json" },
        body: JSON.stringify(body || {}),
      });
      data = await r.json().catch(() => ({}));
    } catch (e) {
      if (at !== shown) return dropped();
      throw e;
    }
    if (at !== shown) return dropped();
    if (r.status === 401) { signOut(); throw new Error(data.message || "not signed in"); }
    if (!r.ok) throw new Error(data.message || ("HTTP " + r.status));
    return data;
  }

  const fmtTime = (ts) => ts ? new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "";
  const fmtMs = (ms) => ms === null || ms === undefined ? "" : (ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : ms.toFixed(1) + " ms");
  const fmtAge = (s) => s < 120 ? Math.round(s) + " s" : s < 7200 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h";
  const num = (v, digits) => el("td", { class: "num" }, v === null || v === undefined ? "" : (digits === undefined ? String(v) : Number(v).toFixed(digits)));

  function table(headers, rows) {
    return el("table", {}, el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, ...rows));
  }

  function show(...nodes) { shown += 1; main.replaceChildren(...nodes); }
  function fail(e) { main.append(el("p", { class: "error", role: "alert" }, String(e.message || e))); }

  function setNav(current) {
    nav.replaceChildren(...VIEWS.map(([id, label]) => el("button", {
      type: "button", "aria-current": id === current ? "page" : null, "data-view": id,
      onclick: () => go(id),
    }, label)));
  }

  function window_() {
    const until = range.until ?? Date.now() / 1000;
    return { since: range.since ?? until - range.span, until };
  }

  function rangeForm(filters, onChange) {
    const span = el("select", { name: "span", "aria-label": "time range" },
      ...RANGES.map(([label, s]) => el("option", { value: s, selected: s === range.span }, "last " + label)));
    const toLocal = (ts) => ts ? new Date(ts * 1000 - new Date().getTimezoneOffset() * 60000).toISOString().slice(0, 16) : "";
    const from = el("input", { type: "datetime-local", name: "from", value: toLocal(range.since) });
    const to = el("input", { type: "datetime-local", name: "to", value: toLocal(range.until) });
    const tenant = el("input", { name: "tenant", placeholder: "any", value: filters.tenant || "" });
    const scenario = el("input", { name: "scenario", placeholder: "any", value: filters.scenario || "" });
    const form = el("form", { class: "filters", onsubmit: (ev) => {
      ev.preventDefault();
      const at = (input) => input.value ? new Date(input.value).getTime() / 1000 : null;
      range = { since: at(from), until: at(to), span: Number(span.value) };
      onChange({ tenant: tenant.value.trim() || null, scenario: scenario.value.trim() || null });
    } },
    el("label", {}, "Range", span),
    el("label", {}, "From", from),
    el("label", {}, "To", to),
    who && who.kind === "admin" ? el("label", {}, "Tenant", tenant) : "",
    el("label", {}, "Scenario", scenario),
    el("button", { type: "submit" }, "Show"));
    return form;
  }

  // -- views ---------------------------------------------------------------------------------
  async function overview(filters = {}) {
    setNav("overview");
    show(el("h2", {}, "Usage and failures by tenant and scenario"), rangeForm(filters, overview));
    try {
      const data = await call("stats", { ...window_(), tenant: filters.tenant, scenario: filters.scenario });
      const rows = data.groups.map((g) => el("tr", {},
        el("td", {}, el("button", { type: "button", class: "link", onclick: () => sessions({ tenant: g.tenant }) }, g.tenant)),
        el("td", {}, el("button", { type: "button", class: "link", onclick: () => sessions({ tenant: g.tenant, scenario: g.scenario }) }, g.scenario ?? "(none)")),
        num(g.sessions), num(g.tool_calls), el("td", { class: "num" }, fmtMs(g.p50_ms)),
        el("td", { class: "num" }, fmtMs(g.p95_ms)),
        el("td", {}, g.failures ? el("button", { type: "button", class: "link", onclick: () => failures({ tenant: g.tenant, scenario: g.scenario }) },
          g.failures + " (" + Object.entries(g.failure_classes).map(([k, n]) => k + ": " + n).join(", ") + ")") : "0"),
        num(g.sandbox_hours, 2)));
      main.append(table(["Tenant", "Scenario", "Sessions", "Tool calls", "p50", "p95", "Failures", "Sandbox-hours"], rows));
      main.append(el("p", { class: "muted" }, fmtTime(data.since) + " to " + fmtTime(data.until) + ", " + data.events + " events"));
    } catch (e) { fail(e); }
  }

  async function sessions(filters = {}, cursor = null) {
    setNav("sessions");
    if (!cursor) show(el("h2", {}, "Sessions"), rangeForm(filters, (f) => sessions(f)));
    try {
      const data = await call("sessions", { ...window_(), ...filters, cursor, limit: 100 });
      const rows = data.sessions.map((s) => el("tr", { class: s.failures ? "failure" : "" },
        el("td", {}, el("button", { type: "button", class: "link session", onclick: () => timeline(s.tenant_id, s.session_id) }, s.session_id)),
        el("td", {}, s.tenant_id), el("td", {}, s.scenario ?? ""), el("td", {}, s.state),
        el("td", {}, fmtTime(s.created_at)), el("td", {}, fmtTime(s.last_at)), num(s.tool_calls), num(s.failures)));
      const list = table(["Session", "Tenant", "Scenario", "State", "Opened", "Last event", "Tool calls", "Failures"], rows);
      main.append(list);
      if (data.next) main.append(el("button", { type: "button", onclick: (ev) => { ev.target.remove(); sessions(filters, data.next); } }, "More"));
    } catch (e) { fail(e); }
  }

  async function timeline(tenant, session, before = null) {
    setNav("sessions");
    if (!before) show(el("h2", {}, "Timeline of session ", el("span", { class: "session-id" }, session), " (", tenant, ")"));
    try {
      const data = await call("timeline", { tenant, session, before, limit: 200 });
      const rows = data.events.map((e) => el("tr", { class: e.error || e.kind === "failure" || e.kind === "sandbox_failed" ? "failure" : "" },
        el("td", {}, fmtTime(e.at)), el("td", {}, e.kind), el("td", {}, e.tool ?? ""),
        el("td", { class: "num" }, fmtMs(e.duration_ms)), num(e.exit_code),
        el("td", { class: "text" }, [e.error, e.reason, e.detail].filter(Boolean).join(" — ")),
        el("td", {}, e.sandbox_id ?? "")));
      main.append(table(["At", "Event", "Tool", "Duration", "Exit", "Detail", "Sandbox"], rows));
      if (data.next) main.append(el("button", { type: "button", onclick: (ev) => { ev.target.remove(); timeline(tenant, session, data.next); } }, "Older events"));
    } catch (e) { fail(e); }
  }

  async function failures(filters = {}) {
    setNav("failures");
    show(el("h2", {}, "Failures"), rangeForm(filters, failures));
    try {
      const data = await call("failures", { ...window_(), ...filters, limit: 200 });
      const rows = data.failures.map((f) => el("tr", { class: "failure" },
        el("td", {}, fmtTime(f.at)), el("td", {}, f.tenant_id), el("td", {}, f.scenario ?? ""),
        el("td", {}, el("button", { type: "button", class: "link session", onclick: () => timeline(f.tenant_id, f.session_id) }, f.session_id)),
        el("td", {}, f.kind + (f.tool ? " " + f.tool : "")), el("td", { class: "text" }, f.error || f.reason || "")));
      main.append(table(["At", "Tenant", "Scenario", "Session", "Event", "Error"], rows));
    } catch (e) { fail(e); }
  }

  async function hosts() {
    setNav("hosts");
    show(el("h2", {}, "Hosts"));
    try {
      const data = await call("hosts", {});
      const rows = data.hosts.map((h) => el("tr", { class: h.state === "ready" ? "" : "failure" },
        el("td", {}, h.host_id), el("td", {}, h.address), el("td", {}, h.state),
        num(h.capacity), num(h.used), num(h.sandboxes), num(h.unstored),
        el("td", {}, h.version ?? ""), el("td", { class: "num" }, fmtAge(h.seen_s_ago))));
      main.append(table(["Host", "Address", "State", "Capacity", "In memory", "Sandboxes", "Paused, not stored", "Version", "Last seen"], rows));
    } catch (e) { fail(e); }
  }

  async function fleetSandboxes() {
    setNav("sandboxes");
    show(el("h2", {}, "Sandboxes"));
    try {
      const data = await call("sandboxes", {});
      const rows = data.sandboxes.map((s) => el("tr", {},
        el("td", {}, s.sandbox_id), el("td", {}, s.tenant), el("td", {}, s.template ?? ""),
        el("td", {}, s.state), el("td", {}, s.host ?? "(in the store)"), el("td", { class: "num" }, fmtAge(s.age_s))));
      main.append(table(["Sandbox", "Tenant", "Template", "State", "Host", "Age"], rows));
    } catch (e) { fail(e); }
  }

  async function sandboxes() {
    if (api === "edge") return fleetSandboxes();
    setNav("sandboxes");
    show(el("h2", {}, "Live sandboxes"));
    try {
      const data = await call("sandboxes", {});
      const rows = data.sandboxes.map((s) => el("tr", {},
        el("td", {}, s.sandbox_id), el("td", {}, s.tenant ?? ""), el("td", {}, s.session_id ?? ""),
        el("td", {}, s.template ?? ""), el("td", {}, s.state), el("td", { class: "num" }, fmtAge(s.age_s)),
        num(s.cpu_pct, 1), num(s.memory_mib, 1), num(s.disk_mib, 1)));
      main.append(table(["Sandbox", "Tenant", "Session", "Template", "State", "Age", "CPU %", "Memory MiB", "Disk MiB"], rows));
    } catch (e) { fail(e); }
  }

  const ROUTES = { overview, sessions, failures, sandboxes, hosts };
  function go(view) { ROUTES[view](); }

  // -- signing in ----------------------------------------------------------------------------
  function signOut() {
    key = null; who = null;
    sessionStorage.removeItem(STORE);
    document.getElementById("who").textContent = "";
    document.getElementById("logout").hidden = true;
    nav.replaceChildren();
    login();
  }

  function login(message) {
    const input = el("input", { type: "password", name: "key", autocomplete: "off", required: true });
    show(el("form", { class: "login", onsubmit: async (ev) => {
      ev.preventDefault();
      key = input.value;
      await start();
    } }, el("label", {}, { gateway: "Admin or tenant key", edge: "API key or metrics token" }[api] || "API key", input),
    el("button", { type: "submit" }, "Sign in")), message ? el("p", { class: "error", role: "alert" }, message) : "");
  }

  async function start() {
    try {
      who = await call("whoami", {});
    } catch (e) { key = null; sessionStorage.removeItem(STORE); login(String(e.message)); return; }
    sessionStorage.setItem(STORE, key);
    document.getElementById("who").textContent = who.kind === "admin" ? "admin" : "tenant " + who.tenant;
    const out = document.getElementById("logout");
    out.hidden = false;
    out.onclick = signOut;
    go(api === "edge" && who.kind !== "admin" ? "sandboxes" : VIEWS[0][0]);
  }

  if (key) start(); else login();
})();
