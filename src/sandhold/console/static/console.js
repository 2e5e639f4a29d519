// The Sandhold console: signing in, the views of this server's kind, navigation.
import { S, el, call, show, main, go } from "./ui.js";
import { routes as usage } from "./usage.js";
import { routes as sandboxes } from "./sandboxes.js";
import { routes as catalog } from "./catalog.js";

const STORE = "sandhold.console.key";
S.views = {
  gateway: [["overview", "Overview"], ["sessions", "Sessions"], ["failures", "Failures"], ["sandboxes", "Sandboxes"]],
  server: [["sandboxes", "Sandboxes"], ["templates", "Templates"], ["snapshots", "Snapshots"], ["volumes", "Volumes"]],
  edge: [["hosts", "Hosts"], ["sandboxes", "Sandboxes"]],
}[S.api];
Object.assign(S.routes, usage, sandboxes, catalog, { signOut });

function signOut() {
  S.key = null; S.who = null;
  sessionStorage.removeItem(STORE);
  document.getElementById("who").textContent = "";
  document.getElementById("logout").hidden = true;
  document.getElementById("nav").replaceChildren();
  login();
}

function login(message) {
  const input = el("input", { type: "password", name: "key", autocomplete: "off", required: true });
  show(el("form", { class: "login", onsubmit: async (ev) => {
    ev.preventDefault();
    S.key = input.value;
    await start();
  } }, el("label", {}, { gateway: "Admin or tenant key", edge: "API key or metrics token" }[S.api] || "API key", input),
  el("button", { type: "submit" }, "Sign in")), message ? el("p", { class: "error", role: "alert" }, message) : "");
}

async function start() {
  try {
    S.who = await call("whoami", {});
  } catch (e) { S.key = null; sessionStorage.removeItem(STORE); login(String(e.message)); return; }
  sessionStorage.setItem(STORE, S.key);
  document.getElementById("who").textContent = S.who.kind === "admin" ? "admin" : "tenant " + S.who.tenant;
  const out = document.getElementById("logout");
  out.hidden = false;
  out.onclick = signOut;
  go(S.api === "edge" && S.who.kind !== "admin" ? "sandboxes" : S.views[0][0]);
}

main.replaceChildren();
if (S.key) start(); else login();
