// H3 Director live memory panel for the ComfyUI front end.
// Polls GET /h3director/stats every 2 s while visible and shows host RSS, device memory and the
// shared-store usage in a small floating box; click it to open /h3director/report.png.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const POLL_MS = 2000;

function gib(bytes) {
  return bytes == null ? "-" : (bytes / 1024 ** 3).toFixed(2) + " GiB";
}

function render(box, stats) {
  const lines = [];
  for (const s of stats.now || []) {
    if (s.device === "host") {
      lines.push(`host RSS ${gib(s.rss_bytes)} / avail ${gib(s.available_bytes)}`);
    } else {
      lines.push(`${s.device} alloc ${gib(s.allocated_bytes)} / free ${gib(s.free_bytes)}`);
    }
  }
  if (stats.shared_store && stats.shared_store.bytes_held != null) {
    lines.push(`shared store ${gib(stats.shared_store.bytes_held)} in ${stats.shared_store.entries} entries`);
  }
  const t = stats.timeline;
  if (t && t.samples && t.samples.length) {
    lines.push(`monitor: ${t.samples.length} recent samples`);
  }
  box.textContent = "H3 Director\n" + lines.join("\n");
}

app.registerExtension({
  name: "h3director.livememory",
  async setup() {
    const box = document.createElement("pre");
    box.id = "h3director-memory";
    Object.assign(box.style, {
      position: "fixed", right: "8px", bottom: "8px", zIndex: 1000, margin: 0,
      padding: "6px 8px", font: "11px monospace", background: "rgba(0,0,0,0.7)",
      color: "#ddd", borderRadius: "4px", cursor: "pointer", whiteSpace: "pre",
    });
    box.title = "H3 Director: click for the memory timeline";
    box.onclick = () => window.open(api.apiURL("/h3director/report.png"), "_blank");
    document.body.appendChild(box);
    async function poll() {
      if (!document.hidden) {
        try {
          const response = await api.fetchApi("/h3director/stats?samples=60");
          if (response.ok) render(box, await response.json());
        } catch (error) {
          box.textContent = "H3 Director: stats unavailable";
        }
      }
      setTimeout(poll, POLL_MS);
    }
    poll();
  },
});
