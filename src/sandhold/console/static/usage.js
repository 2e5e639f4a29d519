// The gateway's views of usage: the overview (charts over time and the table by tenant and
// scenario), sessions, a session's timeline (what each tool call ran and printed) and failures.
import { S, el, call, fmtTime, fmtMs, num, link, table, show, fail, setNav, go, main, saveText, guarded } from "./ui.js";
import { chart } from "./charts.js";

const RANGES = [["1h", 3600], ["24h", 86400], ["7d", 604800], ["30d", 2592000]];
let range = { since: null, until: null, span: 86400 };

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
  return el("form", { class: "filters", onsubmit: (ev) => {
    ev.preventDefault();
    const at = (input) => input.value ? new Date(input.value).getTime() / 1000 : null;
    range = { since: at(from), until: at(to), span: Number(span.value) };
    onChange({ tenant: tenant.value.trim() || null, scenario: scenario.value.trim() || null });
  } },
  el("label", {}, "Range", span),
  el("label", {}, "From", from),
  el("label", {}, "To", to),
  S.who && S.who.kind === "admin" ? el("label", {}, "Tenant", tenant) : "",
  el("label", {}, "Scenario", scenario),
  el("button", { type: "submit" }, "Show"));
}

const groupName = (g) => g.tenant + " / " + (g.scenario ?? "(none)");
const fmtCount = (v) => Number.isInteger(v) ? String(v) : v.toFixed(1);
const fmtSmall = (v) => v === 0 ? "0" : v >= 10 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toPrecision(2);
const fmtHours = (v) => fmtSmall(v) + " h";

// The charts of one series answer; a click on a bucket narrows the tables below to it.
function charts(data, onPick, picked) {
  const xs = data.buckets;
  const t = data.total;
  const top = [...data.groups].sort((a, b) => sum(b.tool_calls) - sum(a.tool_calls)).slice(0, 6);
  const classes = Object.entries(t.failure_classes || {});
  return el("div", { class: "charts" },
    chart({ id: "tool_calls", title: "Tool calls", xs, picked, onPick, format: fmtCount,
      series: [{ name: "total", values: t.tool_calls }, ...top.map((g) => ({ name: groupName(g), values: g.tool_calls }))] }),
    chart({ id: "failures", title: "Failures by class", xs, picked, onPick, bars: true, format: fmtCount,
      series: classes.length ? classes.map(([name, values]) => ({ name, values })) : [{ name: "failures", values: t.failures }] }),
    chart({ id: "latency", title: "Tool-call latency", xs, picked, onPick, format: (v) => fmtMs(v),
      series: [{ name: "p50", values: t.p50_ms }, { name: "p95", values: t.p95_ms }] }),
    chart({ id: "sandbox_hours", title: "Sandbox-hours", xs, picked, onPick, bars: true, format: fmtHours,
      series: [{ name: "total", values: t.sandbox_hours }, ...top.map((g) => ({ name: groupName(g), values: g.sandbox_hours }))] }),
    chart({ id: "sandboxes", title: "Live and paused sandboxes (average)", xs, picked, onPick, format: fmtSmall,
      series: [{ name: "live", values: t.live }, { name: "paused", values: t.paused }] }));
}
const sum = (vs) => (vs || []).reduce((a, v) => a + (v || 0), 0);

async function overview(filters = {}) {
  setNav("overview");
  show(el("h2", {}, "Usage and failures by tenant and scenario"), rangeForm(filters, overview));
  const scope = { tenant: filters.tenant, scenario: filters.scenario };
  const tables = el("section", { "aria-label": "by tenant and scenario" });
  try {
    const data = await call("series", { ...window_(), ...scope });
    const place = el("div");
    const draw = (picked) => place.replaceChildren(charts(data, pick, picked));
    const pick = (i) => {
      draw(i);
      const since = data.buckets[i];
      groups({ since, until: Math.min(since + data.bucket_s, data.until) }, scope, tables, () => { draw(null); groups(data, scope, tables); });
    };
    draw(null);
    main.append(place, tables);
    await groups(data, scope, tables);
  } catch (e) { fail(e); }
}

// The table by tenant and scenario for a range (the whole one, or a picked bucket's).
// Only the latest asked for is shown: a pick answered before the whole range's is not undone.
let asked = 0;
async function groups(span, scope, into, whole) {
  const mine = ++asked;
  into.replaceChildren(el("p", { class: "muted" }, "…"));
  try {
    const data = await call("stats", { since: span.since, until: span.until, ...scope });
    if (mine !== asked) return;
    const rows = data.groups.map((g) => el("tr", {},
      el("td", {}, link(g.tenant, () => sessions({ tenant: g.tenant }))),
      el("td", {}, link(g.scenario ?? "(none)", () => sessions({ tenant: g.tenant, scenario: g.scenario }))),
      num(g.sessions), num(g.tool_calls), el("td", { class: "num" }, fmtMs(g.p50_ms)),
      el("td", { class: "num" }, fmtMs(g.p95_ms)),
      el("td", {}, g.failures ? link(g.failures + " (" + Object.entries(g.failure_classes).map(([k, n]) => k + ": " + n).join(", ") + ")",
        () => failures({ tenant: g.tenant, scenario: g.scenario })) : "0"),
      num(g.sandbox_hours, 2)));
    into.replaceChildren(
      el("h3", {}, whole ? "Picked: " + fmtTime(span.since) + " to " + fmtTime(span.until) + " " : "The whole range ",
        whole ? link("whole range", whole) : ""),
      table(["Tenant", "Scenario", "Sessions", "Tool calls", "p50", "p95", "Failures", "Sandbox-hours"], rows),
      el("p", { class: "muted" }, fmtTime(data.since) + " to " + fmtTime(data.until) + ", " + data.events + " events"));
  } catch (e) { if (mine === asked) { into.replaceChildren(); fail(e, into); } }
}

async function sessions(filters = {}, cursor = null) {
  setNav("sessions");
  if (!cursor) show(el("h2", {}, "Sessions"), rangeForm(filters, (f) => sessions(f)));
  try {
    const data = await call("sessions", { ...window_(), ...filters, cursor, limit: 100 });
    const rows = data.sessions.map((s) => el("tr", { class: s.failures ? "failure" : "" },
      el("td", {}, link(s.session_id, () => timeline(s.tenant_id, s.session_id), "session")),
      el("td", {}, s.tenant_id), el("td", {}, s.scenario ?? ""), el("td", {}, s.state),
      el("td", {}, s.sandbox_id ? link(s.sandbox_id, () => go("sandbox", s.sandbox_id)) : ""),
      el("td", {}, fmtTime(s.created_at)), el("td", {}, fmtTime(s.last_at)), num(s.tool_calls), num(s.failures)));
    main.append(table(["Session", "Tenant", "Scenario", "State", "Sandbox", "Opened", "Last event", "Tool calls", "Failures"], rows));
    if (data.next) main.append(el("button", { type: "button", onclick: (ev) => { ev.target.remove(); sessions(filters, data.next); } }, "More"));
  } catch (e) { fail(e); }
}

const TEXT_LABELS = { input: "ran", stdout: "stdout", stderr: "stderr" };

// What a tool call ran and printed: the head of each text, and its whole kept text on demand.
function ran(tenant, session, e) {
  if (!e.texts) return "";
  return el("div", { class: "ran" }, ...Object.entries(e.texts).map(([name, head]) => {
    const size = (e.sizes || {})[name];
    return el("div", { class: "text-" + name },
      el("span", { class: "muted" }, TEXT_LABELS[name] + (size ? ` (first ${head.length} characters of ${size} bytes)` : "") + " "),
      link("download", async () => {
        try {
          const kept = await call("text", { tenant, session, event: e.id, name });
          saveText(`event-${e.id}-${name}.txt`, kept.text);
        } catch (err) { fail(err); }
      }),
      el("pre", {}, head));
  }));
}

export function eventRow(tenant, session, e) {
  return el("tr", { class: e.error || e.kind === "failure" || e.kind === "sandbox_failed" ? "failure" : "" },
    el("td", {}, fmtTime(e.at)), el("td", {}, e.kind), el("td", {}, e.tool ?? ""),
    el("td", { class: "num" }, fmtMs(e.duration_ms)), num(e.exit_code),
    el("td", { class: "text" }, [e.error, e.reason].filter(Boolean).join(" — "), ran(tenant, session, e)),
    el("td", {}, e.sandbox_id ? link(e.sandbox_id, () => go("sandbox", e.sandbox_id)) : ""));
}
export const EVENT_HEADERS = ["At", "Event", "Tool", "Duration", "Exit", "Detail", "Sandbox"];

async function timeline(tenant, session, before = null) {
  setNav("sessions");
  if (!before) {
    show(el("h2", {}, "Timeline of session ", el("span", { class: "session-id" }, session), " (", tenant, ")"),
      el("p", {}, guarded("Close session", "Close this session? Its sandbox is killed.", async () => {
        await call("close", { tenant, session });
        return "closed";
      })));
  }
  try {
    const data = await call("timeline", { tenant, session, before, limit: 100 });
    main.append(table(EVENT_HEADERS, data.events.map((e) => eventRow(tenant, session, e))));
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
      el("td", {}, link(f.session_id, () => timeline(f.tenant_id, f.session_id), "session")),
      el("td", {}, f.kind + (f.tool ? " " + f.tool : "")), el("td", { class: "text" }, f.error || f.reason || "")));
    main.append(table(["At", "Tenant", "Scenario", "Session", "Event", "Error"], rows));
  } catch (e) { fail(e); }
}

export const routes = { overview, sessions, timeline, failures };
