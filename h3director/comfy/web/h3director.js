// H3 Director live memory panel for the ComfyUI front end.
//
// A sidebar tab ("H3 Memory", registered through app.extensionManager.registerSidebarTab; a floating
// box in the lower right corner on front ends without that API). It polls GET /h3director/stats at the
// `monitor.update_interval_ms` of the pack's config (clamped to 250..5000 ms) while the page is visible,
// keeps the last MAX_POINTS samples in the page, and draws: host RSS and device allocated/reserved over
// time with the node ComfyUI was executing shaded and named (from the websocket `executing` events),
// the current numbers, the caching allocator's fragmentation, each slot pool's heatmap (green leased,
// yellow free, red fallback outside the pool), the shared store / text cache counters, and the per-prompt
// memory ledger (each recent prompt's memory at its end, its net growth not kept on purpose by ComfyUI,
// what ComfyUI keeps: loaded models and cached outputs; leaks in red with their largest new tensors).
// With `monitor.enable_monitor` false the route says why and the panel shows that sentence.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const TAB_ID = "h3director-memory";
const MAX_POINTS = 600;
const SERIES = [
  ["host RSS", "#4e9bff", (p) => p.rss],
  ["device allocated", "#2ca02c", (p) => p.alloc],
  ["device reserved", "#ff7f0e", (p) => p.reserved],
];

const state = {
  stats: null, error: null, points: [], node: null, nodeName: null, names: {}, el: null, polls: 0,
};
window.h3directorPanel = state;  // read by tests and curious users; nothing reads it back

function gib(bytes) {
  return bytes == null ? "-" : (bytes / 1024 ** 3).toFixed(2) + " GiB";
}

function mib(bytes) {
  return bytes == null ? "-" : (bytes / 1024 ** 2).toFixed(1) + " MiB";
}

function signedMib(bytes) {
  return bytes == null ? "-" : (bytes >= 0 ? "+" : "") + mib(bytes);
}

function pct(ratio) {
  return ratio == null ? "-" : (100 * ratio).toFixed(1) + "%";
}

function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "style") Object.assign(node.style, value);
    else node.setAttribute(key, value);
  }
  if (text != null) node.textContent = text;
  return node;
}

function nodeName(id) {
  if (id == null) return null;
  if (state.names[id]) return state.names[id];
  const graphNode = app.graph?.getNodeById?.(Number(id)) ?? app.graph?.getNodeById?.(id);
  const running = state.stats?.running;
  let name = null;
  if (running && String(running.node_id) === String(id)) name = running.title || running.class_type;
  if (!name && graphNode) name = graphNode.title || graphNode.type;
  if (name) state.names[id] = `#${id} ${name}`;
  return name ? state.names[id] : `#${id}`;
}

function onExecuting(event) {
  // Frontend 1.x passes the node id (display node first); older ones passed {node, display_node}.
  const detail = event.detail;
  const raw = detail && typeof detail === "object" ? (detail.display_node ?? detail.node) : detail;
  const id = raw == null ? null : String(raw);
  state.node = id;
  state.nodeName = nodeName(id);
  draw();
}

function onDone() {
  state.node = null;
  state.nodeName = null;
  draw();
}

function record(stats) {
  if (!stats.now) return;
  const host = stats.now.find((s) => s.device === "host") || {};
  const device = stats.now.find((s) => s.device !== "host") || {};
  if (state.node != null && stats.running && String(stats.running.node_id) === state.node) {
    state.nodeName = nodeName(state.node);
  }
  state.points.push({
    t: Date.now() / 1000, rss: host.rss_bytes, alloc: device.allocated_bytes, reserved: device.reserved_bytes,
    free: device.free_bytes, node: state.node == null ? null : state.nodeName,
  });
  if (state.points.length > MAX_POINTS) state.points.splice(0, state.points.length - MAX_POINTS);
}

function intervalMs() {
  const configured = state.stats?.monitor?.update_interval_ms ?? 1000;
  const enabled = state.stats?.monitor?.enabled ?? true;
  return enabled ? Math.min(5000, Math.max(250, configured)) : 5000;
}

async function poll() {
  if (!document.hidden) {
    try {
      const response = await api.fetchApi("/h3director/stats?samples=1");
      const body = await response.json();
      if (response.ok) {
        state.stats = body;
        state.error = null;
        state.polls += 1;
        record(body);
      } else {
        state.error = body.error || `HTTP ${response.status}`;
      }
    } catch (error) {
      state.error = `stats unavailable: ${error}`;
    }
    draw();
  }
  setTimeout(poll, intervalMs());
}

function section(root, id, title) {
  const box = el("div", { id, class: "h3d-section", style: { margin: "8px 0" } });
  box.appendChild(el("div", { style: { fontWeight: "bold", marginBottom: "2px" } }, title));
  root.appendChild(box);
  return box;
}

function line(parent, text, attrs = {}) {
  parent.appendChild(el("div", attrs, text));
}

function drawChart(canvas) {
  const width = canvas.clientWidth || 300;
  const height = 150;
  const ratio = window.devicePixelRatio || 1;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.fillStyle = "#111";
  ctx.fillRect(0, 0, width, height);
  const points = state.points;
  if (points.length < 2) {
    ctx.fillStyle = "#aaa";
    ctx.font = "11px sans-serif";
    ctx.fillText("collecting samples...", 8, 20);
    return;
  }
  const t0 = points[0].t;
  const t1 = points[points.length - 1].t;
  let top = 1;
  for (const [, , get] of SERIES) for (const p of points) top = Math.max(top, get(p) ?? 0);
  const x = (t) => 4 + ((t - t0) / Math.max(1e-6, t1 - t0)) * (width - 8);
  const y = (v) => height - 14 - (v / top) * (height - 30);
  // Node spans: shaded bands named at the top.
  let start = 0;
  for (let i = 1; i <= points.length; i++) {
    if (i === points.length || points[i].node !== points[start].node) {
      if (points[start].node) {
        const left = x(points[start].t);
        const right = x(points[i - 1].t) + 2;
        ctx.fillStyle = "rgba(255,255,255,0.10)";
        ctx.fillRect(left, 12, right - left, height - 26);
        ctx.save();
        ctx.beginPath();
        ctx.rect(left, 0, Math.max(1, right - left), height);
        ctx.clip();   // a short span shows the start of its name, never a squeezed one
        ctx.fillStyle = "#ddd";
        ctx.font = "10px sans-serif";
        ctx.fillText(points[start].node, left + 2, 10);
        ctx.restore();
      }
      start = i;
    }
  }
  for (const [, color, get] of SERIES) {
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let moved = false;
    for (const p of points) {
      const v = get(p);
      if (v == null) continue;
      if (moved) ctx.lineTo(x(p.t), y(v));
      else ctx.moveTo(x(p.t), y(v));
      moved = true;
    }
    ctx.stroke();
  }
  ctx.fillStyle = "#aaa";
  ctx.font = "10px sans-serif";
  ctx.fillText(`${gib(top)} max, last ${(t1 - t0).toFixed(0)} s`, 4, height - 2);
}

function drawHeatmap(parent, device, pool) {
  const info = el("div", {}, `${device}: ${gib(pool.used_bytes)} leased of ${gib(pool.capacity_bytes)} in ` +
    `${pool.slot_count} slots, fragmentation ${pct(pool.fragmentation)}, ` +
    `${pool.fallback_count} fallbacks, ${pool.collections} collections`);
  parent.appendChild(info);
  const heatmap = pool.heatmap;
  if (!heatmap) return;
  const grid = el("div", { class: "h3d-heatmap", "data-device": device, style: { display: "inline-block" } });
  for (const row of heatmap.rows) {
    const rowEl = el("div", { style: { display: "flex" } });
    for (const cell of row) {
      const [label, color] = heatmap.legend[String(cell)];
      rowEl.appendChild(el("div", { title: label, "data-state": label, style: {
        width: "10px", height: "10px", margin: "1px", background: color } }));
    }
    grid.appendChild(rowEl);
  }
  parent.appendChild(grid);
}

function sumBytes(byDevice) {
  return Object.values(byDevice || {}).reduce((a, b) => a + b, 0);
}

function drawLedger(root, ledger) {
  const box = section(root, "h3d-ledger", "prompt ledger");
  const rule = ledger.rule;
  line(box, `leak: ${rule.jobs} prompts of one workflow, each after the first growing by at least ` +
    `${mib(rule.min_growth_bytes)} not kept by ComfyUI`, { style: { color: "#aaa" } });
  for (const leak of ledger.leaks.filter((l) => l.active)) {
    const what = leak.series === "host" ? "host RSS" : `${leak.series} allocated`;
    const item = el("div", { class: "h3d-leak", "data-series": leak.series, style: { color: "#ff6b6b" } },
      `LEAK ${what}: ${signedMib(leak.growth_per_job_bytes)} per prompt over ${leak.jobs} prompts of ` +
      `workflow ${leak.key} (${leak.label || ""}), ${mib(leak.total_bytes)} in all`);
    for (const s of leak.suspects.slice(0, 3)) {
      item.appendChild(el("div", { style: { marginLeft: "10px" } }, `${mib(s.bytes)} ${s.dtype}[${s.shape}] on ` +
        `${s.device}: ${s.owner}${s.node ? ` (node ${s.node})` : ""}`));
    }
    box.appendChild(item);
  }
  const jobs = ledger.jobs.slice(-5).reverse();
  if (!jobs.length) line(box, "no prompt finished yet");
  for (const job of jobs) {
    const end = job.end;
    const parts = [`host RSS ${gib(end.host_rss_bytes)} (${signedMib(job.steps.host)})`];
    for (const [device, d] of Object.entries(end.devices)) {
      parts.push(`${device} allocated ${gib(d.allocated_bytes)} (${signedMib(job.steps[device])}), ` +
        `reserved ${gib(d.reserved_bytes)}`);
    }
    line(box, `#${job.index} ${job.label || job.key} [${job.status}]: ${parts.join("; ")}`,
      { class: "h3d-ledger-prompt", "data-key": job.key });
  }
  const last = ledger.jobs[ledger.jobs.length - 1];
  if (last) {
    const kept = last.end.kept_details || {};
    const models = (kept.models || []).map((m) => `${m.name} ${gib(m.loaded_bytes)} on ${m.device}`);
    line(box, `kept by ComfyUI: ${models.length ? models.join(", ") : "no loaded model"}; ` +
      `${kept.output_cache_entries ?? 0} cached outputs, ${gib(sumBytes(last.end.kept_groups.output_cache))}`,
      { id: "h3d-ledger-kept" });
  }
}

function draw() {
  const root = state.el;
  if (!root) return;
  root.replaceChildren();
  root.appendChild(el("div", { style: { fontWeight: "bold", fontSize: "13px" } }, "H3 Director memory"));
  const stats = state.stats;
  const status = el("div", { id: "h3d-status" });
  root.appendChild(status);
  if (state.error) status.textContent = state.error;
  if (!stats) {
    if (!state.error) status.textContent = "waiting for /h3director/stats ...";
    return;
  }
  const monitor = stats.monitor;
  if (!state.error) {
    status.textContent = monitor.enabled
      ? `monitor on, every ${intervalMs()} ms (${state.polls} samples)` : `monitor off: ${monitor.reason}`;
  }
  const running = stats.running;
  line(root, state.nodeName ? `running: ${state.nodeName}`
    : running ? `running prompt ${running.prompt_id.slice(0, 8)}` : "idle", { id: "h3d-running" });
  if (stats.now) {
    const chartBox = section(root, "h3d-chart-box", "over time");
    const canvas = el("canvas", { id: "h3d-chart", style: { width: "100%", height: "150px" } });
    chartBox.appendChild(canvas);
    const legend = el("div", { style: { fontSize: "10px" } });
    for (const [name, color, get] of SERIES) {
      if (!state.points.some((p) => get(p) != null)) continue;   // no device series on a CPU-only server
      legend.appendChild(el("span", { style: { color, marginRight: "8px" } }, "\u25A0 " + name));
    }
    chartBox.appendChild(legend);
    requestAnimationFrame(() => drawChart(canvas));
    const now = section(root, "h3d-now", "now");
    for (const s of stats.now) {
      if (s.device === "host") {
        line(now, `host RSS ${gib(s.rss_bytes)} (peak ${gib(s.peak_rss_bytes)}), available ${gib(s.available_bytes)}`,
          { class: "h3d-host", "data-rss": String(s.rss_bytes) });
      } else {
        line(now, `${s.device} allocated ${gib(s.allocated_bytes)}, reserved ${gib(s.reserved_bytes)}, ` +
          `free ${gib(s.free_bytes)} of ${gib(s.total_bytes)}`, { class: "h3d-device" });
      }
    }
    if (stats.now.length === 1) line(now, "no accelerator: ComfyUI runs on the CPU");
  }
  if (stats.allocator) {
    const alloc = section(root, "h3d-allocator", "caching allocator");
    const devices = Object.entries(stats.allocator);
    if (!devices.length) line(alloc, "none (CPU only)");
    for (const [device, a] of devices) {
      line(alloc, a.error ? `${device}: ${a.error}` : `${device}: fragmentation ${pct(a.fragmentation)}, ` +
        `cached ${gib(a.inactive_bytes)} in ${a.segments} segments, largest free ${gib(a.largest_inactive_run_bytes)}`);
    }
  }
  if (stats.pools) {
    const pools = section(root, "h3d-pools", "slot pools");
    const devices = Object.entries(stats.pools);
    if (!devices.length) line(pools, "no pool yet (a streaming decode at level >= 1 makes one)");
    for (const [device, pool] of devices) drawHeatmap(pools, device, pool);
  }
  const store = section(root, "h3d-store", "shared store");
  const s = stats.shared_store;
  line(store, s ? `${s.entries} entries, ${gib(s.bytes_held)} held of ${gib(s.memory_budget_bytes)}, ` +
    `${s.hits} hits / ${s.misses} misses (${s.disk_hits} from disk), ${s.spills} spills, saved ${gib(s.bytes_saved)}`
    : "not used yet");
  const tc = stats.text_cache;
  if (tc) {
    line(store, `text cache: ${tc.hits} hits, ${tc.misses} encoder runs, ${tc.bypassed} bypassed, ` +
      `saved ${gib(tc.bytes_saved)}`, { id: "h3d-text-cache" });
  }
  if (stats.ledger) drawLedger(root, stats.ledger);
  const report = el("a", { href: api.apiURL("/h3director/report.png"), target: "_blank" },
    "Monitor nodes' timeline (PNG)");
  if (stats.timeline) root.appendChild(report);
}

function mount(container) {
  const root = el("div", { id: "h3director-panel", style: {
    padding: "8px", font: "11px sans-serif", color: "var(--fg-color, #ddd)", overflowY: "auto", height: "100%",
    boxSizing: "border-box" } });
  container.appendChild(root);
  state.el = root;
  draw();
}

function floatingBox() {
  const box = el("div", { style: {
    position: "fixed", right: "8px", bottom: "8px", width: "340px", maxHeight: "70vh", zIndex: 1000,
    background: "rgba(0,0,0,0.8)", borderRadius: "4px" } });
  document.body.appendChild(box);
  mount(box);
}

app.registerExtension({
  name: "h3director.livememory",
  async setup() {
    api.addEventListener("executing", onExecuting);
    for (const name of ["execution_success", "execution_error", "execution_interrupted"]) {
      api.addEventListener(name, onDone);
    }
    const manager = app.extensionManager;
    if (manager && typeof manager.registerSidebarTab === "function") {
      manager.registerSidebarTab({
        id: TAB_ID, icon: "pi pi-chart-line", title: "H3 Memory", tooltip: "H3 Director: live memory",
        label: "H3 Memory", type: "custom",
        render: (container) => mount(container),
        destroy: () => { state.el = null; },
      });
    } else {
      floatingBox();
    }
    poll();
  },
});
