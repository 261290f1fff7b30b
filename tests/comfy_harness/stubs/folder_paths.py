"""Stand-in for ComfyUI's `folder_paths.py`: output/temp folders and `get_save_image_path`.

`get_save_image_path` follows the real one's contract (returns `(full_output_folder, filename,
counter, subfolder, filename_prefix)`, refuses a prefix leaving the output folder, counter = 1 +
the highest `<filename>_<NNNNN>_` already there). Tests point `output_directory`/`temp_directory`
at a tmp_path.
"""

import os
import re

output_directory = os.path.abspath("output")
temp_directory = os.path.abspath("temp")


def get_output_directory() -> str:
    return output_directory


def get_temp_directory() -> str:
    return temp_directory


def get_save_image_path(filename_prefix: str, output_dir: str, image_width=0, image_height=0):
    subfolder = os.path.dirname(os.path.normpath(filename_prefix))
    filename = os.path.basename(os.path.normpath(filename_prefix))
    full_output_folder = os.path.join(output_dir, subfolder)
    if os.path.commonpath((os.path.abspath(output_dir), os.path.abspath(full_output_folder))) != os.path.abspath(output_dir):
        raise Exception("**** ERROR: Saving image outside the output folder is not allowed.")
    pattern = re.compile(re.escape(filename) + r"_(\d{5})_")
    counters = [int(m.group(1)) for name in (os.listdir(full_output_folder) if os.path.isdir(full_output_folder) else [])
                if (m := pattern.match(name))]
    return full_output_folder, filename, max(counters, default=0) + 1, subfolder, filename_prefix
