// The Tabula dashboard: polls api/cluster every second and redraws.
// Self-contained on purpose (no libraries): the master embeds this file.
// Everything from the cluster goes into the page as text (textContent),
// never as markup.
"use strict";

const POLL_MS = 1000;
let prev = null;          // the previous snapshot, for read and write rates
let lastOK = 0;           // when a snapshot last arrived (Date.now())
const closed = new Set(); // tables the operator folded

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("data-")) e.setAttribute(k, String(v));
    else e[k] = v;
  }
  for (const k of kids.flat()) {
    if (k === undefined || k === null || k === false) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}

function pill(text, cls) { return el("span", { class: "pill " + (cls || ""), text }); }
function statePill(s) { return pill(s.replace(/_/g, " "), "state-" + s); }

function bytes(n) {
  if (!n) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

function num(n) { return (n || 0).toLocaleString("en-US"); }
function rate(n) { return n >= 100 ? Math.round(n).toLocaleString("en-US") : (n || 0).toFixed(1); }

function ago(ms) {
  if (ms < 0) return "never";
  if (ms < 1000) return ms + " ms ago";
  if (ms < 120000) return (ms / 1000).toFixed(1) + " s ago";
  if (ms < 7200000) return Math.round(ms / 60000) + " min ago";
  return Math.round(ms / 3600000) + " h ago";
}

function clock(unixMs) {
  const d = new Date(unixMs);
  return d.toLocaleTimeString("en-GB", { hour12: false });
}

function table(headers, rows) {
  const head = el("tr", {}, headers.map(h => {
    const [label, cls] = Array.isArray(h) ? h : [h, ""];
    return el("th", { class: cls, text: label });
  }));
  return el("div", { class: "scroll" }, el("table", {}, el("thead", {}, head), el("tbody", {}, rows)));
}

function td(v, cls) { return el("td", { class: cls || "" }, v); }

// usageCell draws used against quota (0: no limit).
function usageCell(used, quota, fmt) {
  if (!quota) return td([fmt(used), el("span", { class: "muted", text: " (no limit)" })]);
  const f = used / quota;
  const bar = el("span", { class: "bar" + (f >= 1 ? " over" : f >= 0.8 ? " hot" : "") }, el("span"));
  bar.firstChild.style.width = Math.min(100, Math.round(f * 100)) + "%";
  return td([bar, fmt(used) + " / " + fmt(quota), el("span", { class: "muted", text: " (" + Math.round(f * 100) + "%)" })]);
}

function renderHeader(s) {
  const m = s.master;
  const master = document.getElementById("master");
  let text, cls;
  if (!m.raft) { text = "single master"; cls = "ok"; }
  else if (m.leads) { text = "raft leader: member " + m.member + ", term " + m.term; cls = "ok"; }
  else { text = "raft follower: member " + m.member + (m.leader_id ? ", leader is member " + m.leader_id + " at " + m.leader_addr : ", no leader known"); cls = "warn"; }
  master.textContent = text;
  master.className = "pill " + cls;
  const sm = s.summary;
  const parts = [
    num(sm.servers_alive || 0) + " alive",
    (sm.servers_draining ? num(sm.servers_draining) + " draining" : null),
    (sm.servers_dead ? num(sm.servers_dead) + " dead" : null),
    num(sm.tenants) + " tenants", num(sm.tables) + " tables", num(sm.partitions) + " partitions",
    (sm.partitions_without_primary ? num(sm.partitions_without_primary) + " without a primary" : null),
    (sm.partitions_under_replicated ? num(sm.partitions_under_replicated) + " under-replicated" : null),
    "map v" + m.map_version,
  ].filter(Boolean);
  document.getElementById("summary").textContent = parts.join(" · ");
  const banner = document.getElementById("banner");
  if (m.note) { banner.hidden = false; banner.className = ""; banner.textContent = m.note; }
  else { banner.hidden = true; }
}

function renderServers(s) {
  const dt = prev ? (s.now_ms - prev.now_ms) / 1000 : 0;
  const before = {};
  if (prev) for (const fd of prev.fault_domains) for (const sv of fd.servers) before[sv.id] = sv;
  const box = el("div");
  if (!s.fault_domains.length) box.append(el("p", { class: "muted", text: "No table server has registered." }));
  for (const fd of s.fault_domains) {
    const rows = fd.servers.map(sv => {
      const b = before[sv.id];
      const rr = b && dt > 0 && sv.reads >= b.reads ? (sv.reads - b.reads) / dt : null;
      const wr = b && dt > 0 && sv.writes >= b.writes ? (sv.writes - b.writes) / dt : null;
      const state = [statePill(sv.state)];
      if (sv.state === "dead" && sv.down_since_ms) state.push(el("span", { class: "muted", text: " since " + clock(sv.down_since_ms) }));
      return el("tr", { class: sv.state, "data-server": sv.id, "data-state": sv.state },
        td(el("code", { text: sv.id })), td(sv.addr), td(state),
        td(ago(sv.heard_ago_ms)),
        td(num(sv.primaries), "num"), td(num(sv.secondaries), "num"),
        td(num(sv.keys), "num"), td(bytes(sv.bytes), "num"),
        td(rr === null ? "–" : rate(rr), "num"), td(wr === null ? "–" : rate(wr), "num"),
        td(bytes(sv.stream_bytes), "num"));
    });
    box.append(el("div", { class: "fd", "data-fault-domain": fd.name },
      el("h3", {}, "fault domain ", el("code", { text: fd.name || "(none)" }), el("span", { class: "muted", text: " · " + fd.servers.length + " servers" })),
      table(["server", "address", "state", "last heartbeat", ["primaries", "num"], ["secondaries", "num"],
        ["keys", "num"], ["bytes", "num"], ["reads/s", "num"], ["writes/s", "num"], ["extent bytes", "num"]], rows)));
  }
  document.getElementById("servers").replaceChildren(box);
}

function renderEvents(s) {
  const list = document.getElementById("events");
  if (!s.events.length) {
    list.replaceChildren(el("li", { class: "muted", text: s.master.leads ? "Nothing has happened since this master started leading." : "Events are kept by the leader." }));
    return;
  }
  list.replaceChildren(...s.events.map(e => el("li", { "data-kind": e.kind, "data-server": e.server || "", "data-partition": e.partition || "" },
    el("time", { text: clock(e.unix_ms) }), el("span", { class: "pill kind kind-" + e.kind, text: e.kind.replace(/_/g, " ") }), e.message)));
}

// renderElastic lists the busiest partitions (their share of every
// partition's operations) and the moves and splits under way.
function renderElastic(s) {
  const hot = s.hot || [], changes = s.changes || [];
  document.getElementById("hot").replaceChildren(hot.length ?
    table(["partition", ["#", "num"], ["id", "num"], "primary", ["reads/s", "num"], ["writes/s", "num"], ["share", "num"]],
      hot.map(h => el("tr", { "data-hot": h.id },
        td(el("code", { text: h.tenant + "/" + h.table })), td(num(h.index), "num"), td(num(h.id), "num"),
        td(h.primary ? el("code", { text: h.primary }) : pill("none", "bad")),
        td(rate(h.reads_per_sec), "num"), td(rate(h.writes_per_sec), "num"),
        td(pill(Math.round(h.share * 100) + "%", h.share >= 0.5 ? "warn" : ""), "num")))) :
    el("p", { class: "muted", text: "No partition takes an operation a second." }));
  document.getElementById("changes").replaceChildren(changes.length ?
    table(["partition", ["#", "num"], ["id", "num"], "change", "since"],
      changes.map(c => el("tr", { "data-change": c.kind, "data-partition": c.id },
        td(el("code", { text: c.tenant + "/" + c.table })), td(num(c.index), "num"), td(num(c.id), "num"),
        td(c.kind === "move" ? pill("moving a replica " + c.from + " → " + c.to, "warn") :
          pill("splitting into " + (c.into || []).join(" and "), "warn")),
        td(c.since_ms ? ago(s.now_ms - c.since_ms) : "–")))) :
    el("p", { class: "muted", text: "No move or split under way." }));
}

function renderTenants(s) {
  const rows = s.tenants.map(t => {
    const u = t.usage || {};
    const q = t.quota || {};
    const refused = (u.throttled_per_sec || 0) + (u.quota_refused_per_sec || 0);
    return el("tr", { "data-tenant": t.name },
      td([el("code", { text: t.name }), t.throttled ? [" ", pill("throttled", "bad")] : null]), td(num(t.tables), "num"),
      usageCell(u.stored_bytes || 0, q.stored_bytes, bytes),
      usageCell(u.memory_bytes || 0, q.memory_bytes, bytes),
      usageCell(u.read_ops_per_sec || 0, q.read_ops_per_sec, rate),
      usageCell(u.write_ops_per_sec || 0, q.write_ops_per_sec, rate),
      usageCell(u.coproc_cpu_ms_per_sec || 0, q.coproc_cpu_ms_per_sec, rate),
      td(t.usage ? rate(refused) : "–", "num"));
  });
  const note = s.master.leads ? null : el("p", { class: "muted", text: "Usage is summed by the leader from the servers' heartbeats; a follower has none." });
  document.getElementById("tenants").replaceChildren(
    table(["tenant", ["tables", "num"], "stored", "in memory", "reads/s", "writes/s", "coprocessor ms/s", ["refused/s", "num"]], rows), note || "");
}

function replicaChip(r, p) {
  const cls = "replica " + r.role + (r.server_state === "dead" ? " gone" : "");
  const bits = [el("code", { text: r.server }), " ", r.role];
  if (r.server_state !== "alive") bits.push(" (server " + r.server_state + ")");
  return el("span", { class: cls, "data-server": r.server, "data-role": r.role }, bits);
}

function renderTables(s) {
  const box = el("div");
  if (!s.tables.length) box.append(el("p", { class: "muted", text: "No tables." }));
  for (const t of s.tables) {
    const key = t.tenant + "/" + t.name;
    const rows = [];
    for (const p of t.partitions) {
      const reps = p.replicas.map(r => replicaChip(r, p));
      // A replicated partition's replica shows the master's judgement
      // (sync: in the ack set and within the bound, or why not); others
      // their reported state.
      const states = p.replicas.map(r => el("div", { "data-sync": r.sync || "", title: r.reason || "" },
        el("code", { text: r.server }), " ",
        r.reported ? (r.sync ? statePill(r.sync) : r.state ? statePill(r.state) : pill("reported")) : pill(r.server_state === "dead" ? "no report: server dead" : "no report", r.server_state === "dead" ? "bad" : ""),
        r.state === "copying" && r.copy_total_bytes ? " " + bytes(r.copied_bytes) + " / " + bytes(r.copy_total_bytes) : "",
        r.reported && r.sync && r.sync !== "in_sync" && r.reason ? el("span", { class: "muted", text: " " + r.reason }) : ""));
      const lagTime = r => r.lag_ms < 0 ? "never in step" : r.lag_ms >= 1000 ? (r.lag_ms / 1000).toFixed(1) + " s" : num(r.lag_ms) + " ms";
      const lags = p.replicas.map(r => el("div", {}, r.reported && (r.state || r.commit_lsn) ?
        num(r.lag) + " rec, " + (r.role === "primary" ? "0 ms" : lagTime(r)) + " (applied " + num(r.applied_lsn) + ")" : "–"));
      const notes = [];
      if (!p.primary) notes.push(pill("no primary", "bad"));
      if (p.data_lost) notes.push(pill("data lost", "bad"));
      if (p.under_replicated) notes.push(el("span", { title: p.under_reason || "" }, pill("under-replicated", "bad")));
      if (p.move_from) notes.push(pill("moving " + p.move_from + " → " + p.move_to, "warn"));
      if (p.split_into) notes.push(pill("splitting into " + p.split_into.join(" and "), "warn"));
      if (p.reads_per_sec || p.writes_per_sec) notes.push(el("span", { class: "muted", text: (notes.length ? " " : "") + rate(p.reads_per_sec) + " r/s, " + rate(p.writes_per_sec) + " w/s" }));
      if (p.log_stream) notes.push(el("span", { class: "muted", text: (notes.length ? " " : "") + p.log_stream + (p.log_extent ? " @" + p.log_extent : " (reconfiguring)") }));
      rows.push(el("tr", { "data-partition": p.id, "data-primary": p.primary },
        td(num(p.index), "num"), td(num(p.id), "num"), td(num(p.epoch), "num"),
        td(p.primary ? el("code", { text: p.primary }) : pill("none", "bad")), td(reps), td(states), td(lags, "num"), td(notes)));
    }
    const d = el("details", { "data-table": key, open: !closed.has(key) },
      el("summary", {}, el("strong", { text: key }), el("span", { class: "muted", text:
        " · " + t.kind + " · " + t.storage + (t.durability ? " (" + t.durability + ")" : "") + " · " + t.replication + " replicas · " + t.partitions.length + " partitions" })),
      table([["#", "num"], ["id", "num"], ["epoch", "num"], "primary", "replicas", "replica state", ["lag (records, time)", "num"], "notes"], rows));
    d.addEventListener("toggle", () => { if (d.open) closed.delete(key); else closed.add(key); });
    if (t.bulk) {
      d.append(el("h3", { text: "Bulk versions (serving v" + t.bulk.current + ")" }), table(
        [["version", "num"], ["base", "num"], "state", ["files", "num"], ["bytes", "num"], "loaded (rollout)", "serving since", "error"],
        t.bulk.versions.map(v => el("tr", { "data-bulk-version": v.version },
          td(num(v.version), "num"), td(v.base ? num(v.base) : "–", "num"), td(statePill(v.state)), td(num(v.files), "num"),
          td(bytes(v.bytes), "num"), td(num(v.loaded) + " / " + num(v.files)), td(v.serving_since_unix_ms ? clock(v.serving_since_unix_ms) : "–"), td(v.error || "")))));
    }
    if (t.coprocs && t.coprocs.length) {
      const rows = [];
      for (const c of t.coprocs) for (const v of c.versions) {
        rows.push(el("tr", { "data-coproc": c.name },
          td(el("code", { text: c.name })), td(num(v.version), "num"), td(v.version === c.live ? pill("live", "ok") : ""),
          td(el("code", { text: v.sha256.slice(0, 12) })), td(bytes(v.size), "num"), td((v.methods || []).join(", ")),
          td(v.writes ? "yes" : "no"), td(num(v.ready_on) + " / " + num(v.hosts) + " servers")));
      }
      d.append(el("h3", { text: "Coprocessors" }), table(["name", ["version", "num"], "", "sha256", ["size", "num"], "methods", "writes", "compiled on (rollout)"], rows));
    }
    box.append(d);
  }
  if (s.partitions_omitted) box.append(el("p", { class: "muted", text: num(s.partitions_omitted) + " more partitions not shown." }));
  document.getElementById("tables").replaceChildren(box);
}

function renderStreams(s) {
  const st = s.streams;
  const tasks = Object.entries(st.tasks).map(([k, n]) => k.replace(/_/g, " ") + " " + n).join(", ") || "none";
  const coding = Object.entries(st.coding).map(([k, n]) => k + " " + n).join(", ") || "none";
  const rows = [];
  for (const x of st.list) {
    for (const e of x.last) {
      const coded = e.coding ? [statePill(e.coding), " " + e.scheme + " " + e.fragments_ok + "/" + e.fragments + " fragments" + (e.rebuilding ? ", " + e.rebuilding + " rebuilding" : "")] : el("span", { class: "muted", text: "replicated" });
      rows.push(el("tr", { "data-stream": x.name, "data-extent": e.id },
        td(el("code", { text: x.name })), td(num(e.id), "num"), td(e.sealed ? "sealed" : pill("open", "ok")), td(e.sealed ? bytes(e.length) : "–", "num"),
        td(e.replicas.join(" ")), td(coded)));
    }
  }
  document.getElementById("streams").replaceChildren(
    el("p", {}, num(st.streams) + " streams, " + num(st.extents) + " extents · coding: " + coding + " · pending stream-manager tasks: " + tasks),
    table(["stream", ["extent", "num"], "", ["length", "num"], "replicas (node:state)", "coding"], rows),
    st.omitted ? el("p", { class: "muted", text: num(st.omitted) + " more streams not shown (the last " + 8 + " extents of each stream are)." }) : "");
}

function render(s) {
  renderHeader(s);
  renderServers(s);
  renderEvents(s);
  renderElastic(s);
  renderTenants(s);
  renderTables(s);
  renderStreams(s);
  prev = s;
}

function tickUpdated() {
  const u = document.getElementById("updated");
  if (!lastOK) { u.textContent = ""; return; }
  const age = Date.now() - lastOK;
  u.textContent = "updated " + ago(age);
  const banner = document.getElementById("banner");
  if (age > 3 * POLL_MS) {
    banner.hidden = false;
    banner.className = "bad";
    banner.textContent = "The master does not answer: the page shows what it last knew, " + ago(age) + ".";
  }
}

async function poll() {
  try {
    const r = await fetch("api/cluster", { cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    const s = await r.json();
    lastOK = Date.now();
    render(s);
  } catch (err) {
    if (!lastOK) {
      const banner = document.getElementById("banner");
      banner.hidden = false;
      banner.className = "bad";
      banner.textContent = "Cannot reach the master: " + err.message;
    }
  }
  tickUpdated();
  setTimeout(poll, POLL_MS);
}

setInterval(tickUpdated, 250);
poll();
