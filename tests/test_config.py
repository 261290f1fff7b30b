"""h3_config.yaml: the packaged default, every kind of validation error, level expansion, env overrides."""

from __future__ import annotations

import pytest
import yaml
from pydantic import BaseModel

from h3director.core.config import (
    MAX_CONFIG_BYTES,
    ConfigValidationError,
    H3Config,
    default_config_path,
    env_name,
    find_config_path,
    load_config,
    read_config_file,
    validate_config,
)
from h3director.errors import ConfigError


def _problems(data, env=None) -> dict[str, str]:
    with pytest.raises(ConfigValidationError) as info:
        validate_config(data, env=env or {})
    return {problem.path: str(problem) for problem in info.value.problems}


def _write(tmp_path, text: str):
    path = tmp_path / "h3_config.yaml"
    path.write_text(text)
    return path


def test_packaged_default_lists_every_field_with_the_model_defaults():
    raw = yaml.safe_load(default_config_path().read_text())

    def keys(tree, model):
        for name, field in model.model_fields.items():
            assert name in tree, f"packaged h3_config.yaml lacks {name}"
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(tree[name], dict):
                keys(tree[name], annotation)

    keys(raw, H3Config)
    assert set(raw) == set(H3Config.model_fields)
    assert load_config(default_config_path(), env={}).model_dump() == H3Config().model_dump()


def test_search_order_explicit_then_env_then_cwd_then_packaged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_config_path(env={}) == default_config_path()
    local = _write(tmp_path, "memory_optimization_level: 1\n")
    assert find_config_path(env={}) == local
    other = tmp_path / "other.yaml"
    other.write_text("memory_optimization_level: 0\n")
    assert find_config_path(env={"H3_CONFIG": str(other)}) == other
    assert find_config_path(local, env={"H3_CONFIG": str(other)}) == local
    assert load_config(env={"H3_CONFIG": str(other)}).memory_optimization_level == 0
    assert load_config(env={}).memory_optimization_level == 1


def test_out_of_range_and_wrong_type_name_path_value_and_allowed():
    found = _problems({
        "memory_optimization_level": 4,
        "pool_slot_mb": "64",
        "monitor": {"update_interval_ms": 5, "enable_monitor": "yes please"},
        "video_decode": {"crf": 60},
    })
    assert set(found) == {"memory_optimization_level", "pool_slot_mb", "monitor.update_interval_ms",
                          "monitor.enable_monitor", "video_decode.crf"}
    assert "4" in found["memory_optimization_level"] and "0 <= value <= 3" in found["memory_optimization_level"]
    assert "'64'" in found["pool_slot_mb"] and "integer" in found["pool_slot_mb"]
    assert "10 <= value <= 60000" in found["monitor.update_interval_ms"]
    assert "0 <= value <= 51" in found["video_decode.crf"]


def test_bool_is_not_an_int_and_float_is_not_silently_truncated():
    found = _problems({"pre_allocated_pool_mb": True, "generation_gc_interval_ms": 120.5})
    assert set(found) == {"pre_allocated_pool_mb", "generation_gc_interval_ms"}


def test_pool_must_be_whole_gibibytes_with_neighbours_suggested():
    found = _problems({"pre_allocated_pool_mb": 1500})
    assert "1500" in found["pre_allocated_pool_mb"]
    assert "multiple of 1024" in found["pre_allocated_pool_mb"]
    assert "1024 or 2048" in found["pre_allocated_pool_mb"]
    assert validate_config({"pre_allocated_pool_mb": 0}).features().pool is False
    assert validate_config({"pre_allocated_pool_mb": 3072}).pool_bytes == 3 * 1024**3


def test_literal_choices_are_listed():
    found = _problems({"memory_safety": {"action_on_exceed": "explode"}, "allocator": {"backend": "malloc"}})
    assert "'stop_and_clear', 'reduce_batch' or 'fallback_to_cpu'" in found["memory_safety.action_on_exceed"]
    assert "'explode'" in found["memory_safety.action_on_exceed"]
    assert "'cudaMallocAsync'" in found["allocator.backend"]


def test_removed_fields_say_they_did_nothing():
    found = _problems({"video_decode": {"sink": "uint8"}, "video_upscale": {"tile_size": 64},
                       "multi_gpu": {"enabled": False}, "cross_modal_shared_memory": {"enabled": True}})
    assert set(found) == {"video_decode.sink", "video_upscale", "multi_gpu", "cross_modal_shared_memory"}
    assert all("removed (it did nothing" in text for text in found.values())


def test_unknown_keys_get_did_you_mean_at_every_depth():
    found = _problems({"memory_optimisation_level": 2, "video_decode": {"oom_retries": True},
                       "max_gpu_memory_mb": 8000})
    assert "did you mean 'memory_optimization_level'" in found["memory_optimisation_level"]
    assert "did you mean 'oom_retry'" in found["video_decode.oom_retries"]
    assert "did you mean 'memory_safety.max_gpu_memory_mb'" in found["max_gpu_memory_mb"]


def test_rules_across_fields():
    found = _problems({
        "allocator": {"backend": "cudaMallocAsync", "expandable_segments": True},
        "pre_allocated_pool_mb": 1024,
        "pool_slot_mb": 2048,
    })
    assert "cudaMallocAsync" in found["allocator"] and "expandable_segments" in found["allocator"]
    assert "2048" in found["pool_slot_mb"] and "at most pre_allocated_pool_mb (1024)" in found["pool_slot_mb"]


def test_every_problem_is_reported_not_just_the_first():
    with pytest.raises(ConfigValidationError) as info:
        validate_config({"memory_optimization_level": -1, "pool_slot_mb": 0, "bogus": 1,
                         "video_decode": {"audio_chunk_seconds": 0}}, env={})
    assert len(info.value.problems) == 4
    assert str(info.value).count("\n  - ") == 4


@pytest.mark.parametrize("level, expected", [
    (0, set()),
    (1, {"pool", "streaming_decode"}),
    (2, {"pool", "generation_gc", "streaming_decode"}),
    (3, {"pool", "generation_gc", "streaming_decode", "shared_memory", "cross_node_shared_memory"}),
])
def test_levels_expand_to_switches(level, expected):
    config = validate_config({"memory_optimization_level": level, "memory_safety": {"enabled": False},
                              "pre_allocated_pool_mb": 1024})       # the pool is opt-in (default 0)
    assert set(config.features().enabled()) == expected


def test_explicit_switches_veto_and_independent_switches():
    config = validate_config({"memory_optimization_level": 3, "shared_memory_enabled": False,
                              "pre_allocated_pool_mb": 0, "monitor": {"enable_monitor": True},
                              "debug_shared_memory": True})
    features = config.features()
    assert not features.pool and not features.shared_memory and not features.cross_node_shared_memory
    assert not features.debug_shared_memory
    assert features.monitor and features.guard and features.streaming_decode
    assert config.notes() == []
    assert validate_config({}).pre_allocated_pool_mb == 0 and not validate_config({}).features().pool
    assert any("no effect at memory_optimization_level 0" in note
               for note in validate_config({"memory_optimization_level": 0, "pre_allocated_pool_mb": 1024}).notes())
    level0 = validate_config({"memory_optimization_level": 0, "debug_shared_memory": True})
    assert level0.features().enabled() == ["guard"]
    assert any("debug_shared_memory" in note for note in level0.notes())


def test_env_overrides_nested_and_typed_as_yaml():
    env = {
        "H3_MEMORY_OPTIMIZATION_LEVEL": "3",
        "H3_MEMORY_SAFETY__MAX_GPU_MEMORY_MB": "8000",
        "H3_ALLOCATOR__EXPANDABLE_SEGMENTS": "true",
        "H3_SHARED_MEMORY_BUDGET_MB": "64",
        "H3_VIDEO_DECODE__TILES_PER_CALL": "null",
        "H3_TORCH_VERSION": "2.13.0",  # a set-up knob, not config
        "H3_NATIVE": "numpy",  # a switch of the native core, not config
        "PATH": "/bin",
    }
    config = validate_config({"memory_optimization_level": 1, "video_decode": {"tiles_per_call": 4}}, env=env)
    assert config.memory_optimization_level == 3
    assert config.memory_safety.max_gpu_memory_bytes == 8000 * 1024**2
    assert config.allocator.to_pytorch_alloc_conf() == "expandable_segments:True"
    assert config.shared_memory_budget_bytes == 64 * 1024**2
    assert config.video_decode.tiles_per_call is None
    assert config.env_overrides["H3_MEMORY_SAFETY__MAX_GPU_MEMORY_MB"] == 8000
    assert "H3_TORCH_VERSION" not in config.env_overrides


def test_env_override_of_a_whole_section_is_recorded_under_its_variable():
    config = validate_config({}, env={"H3_MEMORY_SAFETY": "{enabled: false, max_gpu_memory_mb: 512}"})
    assert config.memory_safety.enabled is False
    assert config.memory_safety.max_gpu_memory_mb == 512
    assert config.env_overrides == {"H3_MEMORY_SAFETY": {"enabled": False, "max_gpu_memory_mb": 512}}


def test_env_field_under_a_scalar_section_is_a_problem_not_a_crash():
    found = _problems({}, env={"H3_MEMORY_SAFETY": "5", "H3_MEMORY_SAFETY__ENABLED": "true"})
    assert "expected a mapping" in found["memory_safety"]
    assert "H3_MEMORY_SAFETY already sets memory_safety to 5" in found["memory_safety.enabled"]


def test_env_override_errors_name_the_variable():
    found = _problems({}, env={"H3_MEMORY_OPTIMIZATION_LEVEL": "high", "H3_MEMORY_SAFETY_MAX_GPU_MEMORY_MB": "8000",
                               "H3_MONITOR__UPDATE_INTERVAL": "100"})
    assert "H3_MEMORY_OPTIMIZATION_LEVEL" in found["memory_optimization_level"]
    assert "'high'" in found["memory_optimization_level"]
    assert "did you mean H3_MEMORY_SAFETY__MAX_GPU_MEMORY_MB" in found["memory_safety_max_gpu_memory_mb"]
    assert "did you mean H3_MONITOR__UPDATE_INTERVAL_MS" in found["monitor.update_interval"]


def test_an_h3_variable_that_is_neither_a_field_nor_a_switch_is_reported():
    found = _problems({}, env={"H3_SOMETHING_ELSE": "x", "H3_CONFIG": "/nowhere.yaml", "H3_NATIVE": "c",
                               "H3_NATIVE_LIB": "/lib.so", "H3_TORCH_VERSION": "2.13.0"})
    assert list(found) == ["something_else"]
    assert "H3_SOMETHING_ELSE is neither a config field nor one of h3director's own switches" in found["something_else"]
    for switch in ("H3_CONFIG", "H3_NATIVE", "H3_NATIVE_LIB", "H3_TORCH_VERSION"):
        assert switch in found["something_else"]


def test_every_h3_variable_the_code_reads_is_a_field_or_a_known_switch():
    import re
    from pathlib import Path

    from h3director.core.config import ENV_NOT_CONFIG, _field_paths

    root = Path(__file__).resolve().parents[1]
    fields = {env_name(path) for path in _field_paths()}
    # os.environ["H3_X"], os.environ.get("H3_X"), os.getenv("H3_X"), env.get("H3_X"), NAME_ENV = "H3_X"
    reads = re.compile(r"""(?:environ\s*\[|\.get\(|getenv\(|_ENV\s*=)\s*["'](H3_[A-Z0-9_]+)["']""")
    read = set()
    for path in [*(root / "h3director").rglob("*.py"), *(root / "bench").rglob("*.py"),
                 *(root / "scripts").rglob("*.py"), *root.glob("*.py")]:
        read |= set(reads.findall(path.read_text()))
    for path in [*(root / "scripts").glob("*.sh"), *(root / "tests").rglob("*.sh")]:
        read |= set(re.findall(r"\$\{?(H3_[A-Z0-9_]+)", path.read_text()))
    assert {"H3_CONFIG", "H3_NATIVE", "H3_NATIVE_LIB", "H3_TORCH_VERSION"} <= read  # the scan finds them
    assert read - fields - ENV_NOT_CONFIG == set()


def test_the_error_blames_the_variable_not_the_file_for_a_bad_environment_value():
    with pytest.raises(ConfigValidationError) as info:
        validate_config({}, source="/pkg/h3_config.yaml", env={"H3_MEMORY_OPTIMIZATION_LEVEL": "9"})
    first = str(info.value).splitlines()[0]
    assert first == "invalid environment override H3_MEMORY_OPTIMIZATION_LEVEL (over /pkg/h3_config.yaml): 1 problem"
    with pytest.raises(ConfigValidationError) as info:
        validate_config({"pool_slot_mb": 0}, source="/my.yaml", env={"H3_VIDEO_DECODE__SINK": "gif"})
    assert str(info.value).splitlines()[0] == ("invalid configuration /my.yaml and environment override "
                                               "H3_VIDEO_DECODE__SINK: 2 problems")
    with pytest.raises(ConfigValidationError) as info:
        validate_config({"pool_slot_mb": 0}, source="/my.yaml")
    assert str(info.value).splitlines()[0] == "invalid configuration /my.yaml: 1 problem"


def test_a_problem_inside_a_whole_section_variable_names_that_variable():
    found = _problems({}, env={"H3_MEMORY_SAFETY": "{enabled: 5, max_gpu_memory_mbb: 1}"})
    assert "(from H3_MEMORY_SAFETY)" in found["memory_safety.enabled"]
    assert "(from H3_MEMORY_SAFETY)" in found["memory_safety.max_gpu_memory_mbb"]


def test_env_name_round_trip():
    assert env_name(("memory_safety", "max_gpu_memory_mb")) == "H3_MEMORY_SAFETY__MAX_GPU_MEMORY_MB"
    assert env_name("monitor.update_interval_ms") == "H3_MONITOR__UPDATE_INTERVAL_MS"


def test_allocator_conf_string():
    config = validate_config({"allocator": {"backend": "native", "expandable_segments": True,
                                            "max_split_size_mb": 512, "garbage_collection_threshold": 0.6}})
    assert config.allocator.to_pytorch_alloc_conf() == (
        "backend:native,expandable_segments:True,max_split_size_mb:512,garbage_collection_threshold:0.6")
    assert H3Config().allocator.to_pytorch_alloc_conf() is None


def test_untrusted_yaml_is_bounded_and_safe(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigValidationError, match="at most"):
        read_config_file(big)
    cases = {
        "a: &x [1, 2]\nb: *x\n": "aliases",
        "memory_optimization_level: 1\nmemory_optimization_level: 2\n": "duplicate key",
        "!!python/object/apply:os.system ['true']\n": "not valid YAML",
        "video_decode: [1\n": "line 2",
        "- 1\n- 2\n": "must be a mapping",
    }
    for text, expected in cases.items():
        with pytest.raises(ConfigValidationError, match=expected):
            read_config_file(_write(tmp_path, text))
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigValidationError, match="UTF-8"):
        read_config_file(tmp_path / "bin.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        read_config_file(tmp_path / "missing.yaml")


def test_empty_file_means_all_defaults(tmp_path):
    config = load_config(_write(tmp_path, "# nothing\n"), env={})
    assert config.model_dump() == H3Config().model_dump()
    assert config.source.endswith("h3_config.yaml")
