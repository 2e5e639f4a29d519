// Sandboxes: the live ones, one sandbox's page (what it is, its usage over its life, its events,
// kill and pause), and on a fleet's edge the hosts and which host holds each sandbox.
import { S, el, call, fmtTime, fmtAge, num, link, table, facts, show, fail, setNav, main, guarded, listing } from "./ui.js";
import { chart } from "./charts.js";
import { eventRow, EVENT_HEADERS } from "./usage.js";
import { templateName } from "./catalog.js";

const REFRESH_MS = 5000;

function sandboxes() {
  if (S.api === "edge") return fleetSandboxes();
  return listing("sandboxes", "Live sandboxes", "sandboxes", "sandboxes",
    ["Sandbox", "Tenant", "Session", "Template", "State", "Age", "CPU %", "Memory MiB", "Disk MiB"], (s) => el("tr", {},
      el("td", {}, link(s.sandbox_id, () => sandbox(s.sandbox_id), "sandbox")), el("td", {}, s.tenant ?? ""),
      el("td", {}, s.session_id ?? ""), el("td", {}, templateName(s.template)), el("td", {}, s.state),
      el("td", { class: "num" }, fmtAge(s.age_s)), num(s.cpu_pct, 1), num(s.memory_mib, 1), num(s.disk_mib, 1)));
}

function limits(l) {
  if (!l) return "";
  return Object.entries(l).filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => k + " " + v).join(", ");
}

function usageCharts(history) {
  const xs = history.map((h) => h.at);
  const series = (key) => [{ name: key, values: history.map((h) => h[key] ?? null) }];
  return el("div", { class: "charts" },
    chart({ id: "cpu", title: "CPU %", xs, series: series("cpu_pct"), format: (v) => v.toFixed(0) + " %" }),
    chart({ id: "memory", title: "Memory (MiB)", xs, series: series("memory_mib"), format: (v) => v.toFixed(0) }),
    chart({ id: "disk", title: "Disk (MiB)", xs, series: series("disk_mib"), format: (v) => v.toFixed(0) }));
}

function events(s, list) {
  if (!list || !list.length) return el("p", { class: "muted" }, "No events.");
  if (list[0].kind !== undefined) return table(EVENT_HEADERS, list.map((e) => eventRow(s.tenant, s.session_id, e)));
  // the sandbox's own log (sandhold serve): its lines as text
  return table(["At", "Level", "Message"], list.map((l) => el("tr", {},
    el("td", {}, typeof l.at === "number" ? fmtTime(l.at) : (l.timestamp ?? l.at ?? "")),
    el("td", {}, l.level ?? ""), el("td", { class: "text" }, l.message ?? l.line ?? JSON.stringify(l)))));
}

async function sandbox(id) {
  setNav("sandboxes");
  show(el("h2", {}, "Sandbox ", el("span", { class: "sandbox-id" }, id)));
  const at = S.shown;
  const place = el("div");
  main.append(place);
  const draw = async () => {
    const data = await call("sandbox", { sandbox_id: id });
    const s = data.sandbox;
    const owner = s.session_id ? s.tenant + " / session " + s.session_id : (s.team ?? s.tenant ?? "");
    const actions = s.state === "running" || s.state === "paused" ? el("p", { class: "actions" },
      guarded("Kill", "Kill this sandbox? Its processes and files are gone.", async () => {
        await call("kill", { sandbox_id: id }); return "killed";
      }),
      s.state === "running" ? guarded("Pause", "Pause this sandbox?", async () => {
        await call("pause", { sandbox_id: id }); return "paused";
      }) : "") : "";
    place.replaceChildren(
      facts([["State", s.state + (s.failure ? " (failed: " + s.failure + ")" : "") + (s.suspended ? " (on disk)" : "")],
        ["Owner", owner], ["Template", templateName(s.template)], ["Limits", limits(s.limits)],
        ["Age", s.age_s !== undefined ? fmtAge(s.age_s) : ""], ["Started", fmtTime(s.started_at)], ["Ends or ended", fmtTime(s.end_at)],
        ["Metadata", Object.entries(s.metadata || {}).map(([k, v]) => k + "=" + v).join(", ")]]),
      actions,
      el("h3", {}, "Usage over its life"),
      data.history && data.history.length ? usageCharts(data.history) : el("p", { class: "muted" }, "No samples."),
      el("h3", {}, "Events"), events(s, data.events));
  };
  try {
    await draw();
    const timer = setInterval(async () => {
      if (S.shown !== at) { clearInterval(timer); return; }
      if (place.querySelector(".confirm")) return; // not while an action is being confirmed
      try { await draw(); } catch (e) { clearInterval(timer); fail(e); }
    }, REFRESH_MS);
  } catch (e) { fail(e); }
}

const hosts = () => listing("hosts", "Hosts", "hosts", "hosts",
  ["Host", "Address", "State", "Capacity", "In memory", "Sandboxes", "Paused, not stored", "Version", "Last seen"],
  (h) => el("tr", { class: h.state === "ready" ? "" : "failure" },
    el("td", {}, h.host_id), el("td", {}, h.address), el("td", {}, h.state),
    num(h.capacity), num(h.used), num(h.sandboxes), num(h.unstored),
    el("td", {}, h.version ?? ""), el("td", { class: "num" }, fmtAge(h.seen_s_ago))));

const fleetSandboxes = () => listing("sandboxes", "Sandboxes", "sandboxes", "sandboxes",
  ["Sandbox", "Tenant", "Template", "State", "Host", "Age"], (s) => el("tr", {},
    el("td", {}, s.sandbox_id), el("td", {}, s.tenant), el("td", {}, s.template ?? ""),
    el("td", {}, s.state), el("td", {}, s.host ?? "(in the store)"), el("td", { class: "num" }, fmtAge(s.age_s))));

export const routes = { sandboxes, sandbox, hosts };
