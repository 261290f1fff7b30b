"""The render farm: batches of ComfyUI or diffusers H3 jobs placed on devices by predicted memory, on Ray.

- `jobs`: the JSONL job file (parse, validate, apply overrides to a ComfyUI API workflow);
- `needs`: the planner's ladder of settings per job and its memory need on each rung;
- `ledger`: the SQLite job ledger (states, attempts, intervals, outputs): idempotent and resumable;
- `serve`: the launcher a worker runs ComfyUI through (the server exits when its worker dies);
- `comfy_server`: one ComfyUI server on loopback, driven over HTTP (no ComfyUI import);
- `diffusers_job`: the ``diffusers`` job spec and the pipeline a worker keeps loaded for it;
- `worker`: the Ray actor bound to one device; `driver`: schedules jobs as Ray tasks by resources;
- `progress`: the live display and the final table.

Nothing here imports ComfyUI; `ray` and `rich` (the `farm` extra) and diffusers (`diffusers_job`, in the worker)
are imported where used.
"""

__all__: list[str] = []
