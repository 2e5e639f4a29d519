// What a team keeps on a server (sandhold serve): templates with their builds and a build's
// steps and logs, snapshots, volumes.
import { el, call, fmtTime, fmtBytes, num, link, table, facts, show, fail, setNav, main, listing } from "./ui.js";

const when = (v) => typeof v === "number" ? fmtTime(v) : (v ?? "");
const names = (t) => (t.aliases || t.names || []).join(", ");
export const templateName = (t) => !t ? "" : typeof t === "string" ? t : (t.alias || t.name || t.template_id || "");

const templates = () => listing("templates", "Templates", "templates", "templates",
  ["Template", "Names", "Tags", "Public", "Size", "Updated", "Last build", "Earlier builds"], (t) => {
    const last = (t.builds || [])[0];
    return el("tr", {},
      el("td", {}, t.template_id), el("td", { class: "text" }, names(t)),
      el("td", { class: "text" }, (t.tags || []).join(", ")), el("td", {}, t.public ? "yes" : "no"),
      el("td", { class: "num" }, fmtBytes(t.size_bytes)), el("td", {}, when(t.updated_at ?? t.created_at)),
      el("td", {}, last ? link((last.status ?? "") + " " + when(last.started_at ?? last.created_at), () => build(t.template_id, last.build_id), "build") : ""),
      el("td", {}, ...(t.builds || []).slice(1, 4).map((b) => link(b.status ?? b.build_id, () => build(t.template_id, b.build_id), "build"))));
  });

async function build(templateId, buildId, offset = 0) {
  setNav("templates");
  if (!offset) show(el("h2", {}, "Build ", el("span", { class: "build-id" }, buildId), " of ", templateId));
  try {
    const data = await call("build", { template_id: templateId, build_id: buildId, offset });
    const b = data.build || data;
    if (!offset) {
      main.append(facts([["Status", b.status], ["Tags", (b.tags || []).join(", ")], ["Started", when(b.started_at)], ["Finished", when(b.finished_at)], ["Reason", b.reason ?? ""]]));
      if (data.steps && data.steps.length) {
        main.append(el("h3", {}, "Steps"), table(["#", "Step", "Cache"], data.steps.map((s, i) => el("tr", {},
          num(s.step ?? i + 1), el("td", { class: "text" }, s.text ?? ""), el("td", {}, s.cached ? "cached" : "run")))));
      }
      main.append(el("h3", {}, "Logs"));
    }
    const lines = (data.logs || []).map((l) => (l.at ? fmtTime(l.at) + " " : "") + (l.level && l.level !== "info" ? l.level + ": " : "") + (l.message ?? ""));
    main.append(el("pre", { class: "logs" }, lines.join("\n")));
    if (data.next !== null && data.next !== undefined) {
      main.append(el("button", { type: "button", onclick: (ev) => { ev.target.remove(); build(templateId, buildId, data.next); } }, "More"));
    }
  } catch (e) { fail(e); }
}

const snapshots = () => listing("snapshots", "Snapshots", "snapshots", "snapshots",
  ["Snapshot", "Names", "Source sandbox", "Template", "Size", "Stored", "Created"], (s) => el("tr", {},
    el("td", {}, s.snapshot_id), el("td", { class: "text" }, names(s)), el("td", {}, s.source_sandbox ?? ""),
    el("td", {}, templateName(s.template)), el("td", { class: "num" }, fmtBytes(s.size_bytes)),
    el("td", {}, (s.stored || []).join(", ") || "nowhere"), el("td", {}, when(s.created_at))));

const volumes = () => listing("volumes", "Volumes", "volumes", "volumes", ["Volume", "Name", "Size", "Created"],
  (v) => el("tr", {}, el("td", {}, v.volume_id), el("td", { class: "text" }, v.name),
    el("td", { class: "num" }, fmtBytes(v.size_bytes)), el("td", {}, when(v.created_at))));

export const routes = { templates, build, snapshots, volumes };
