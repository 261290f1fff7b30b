"""ComfyUI node pack. Imports ComfyUI (`comfy_api`, `comfy`, `folder_paths`, `server`) only when
ComfyUI loads the pack, through the repository root's `__init__.py` (`comfy_entrypoint`).

Modules: `extension` (the `ComfyExtension`: node list, routes on load); one module of nodes per
area (`nodes_decode`, `nodes_monitor`, `nodes_guard`, `nodes_shared`, `nodes_frames`,
`nodes_plan`, `nodes_blockswap`, ...); `routes` (`/h3director/*`); `live` (the process's monitors); `latents` (LATENT
checks); `image_sink` (IMAGE-producing sinks); `runtime` (the ComfyUI services used, imported when
called); `settings` (the config the pack runs with); `alloc_env` (allocator settings for
`prestartup_script.py`); `web/` (the front-end extension, `WEB_DIRECTORY`).
"""

__all__: list[str] = []
