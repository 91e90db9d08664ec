"""Environment variables are parsed in one place, strictly."""

from __future__ import annotations

import pytest

from enginefarm.errors import ConfigError
from enginefarm.settings import load_settings


@pytest.mark.parametrize(
    "raw,expected",
    [("1", True), ("true", True), ("YES", True), ("0", False), ("false", False), ("", False), ("off", False)],
)
def test_offline_parsing(raw, expected):
    assert load_settings({"ENGINEFARM_OFFLINE": raw}).offline is expected


def test_offline_zero_is_off_not_on():
    assert load_settings({"ENGINEFARM_OFFLINE": "0"}).offline is False


def test_bad_boolean_is_an_error():
    with pytest.raises(ConfigError, match="ENGINEFARM_OFFLINE='maybe'"):
        load_settings({"ENGINEFARM_OFFLINE": "maybe"})


@pytest.mark.parametrize(
    "raw,expected", [("", None), ("1024", 1024), ("10M", 10 << 20), ("1.5G", int(1.5 * (1 << 30))), ("2gb", 2 << 30)]
)
def test_quota_parsing(raw, expected):
    assert load_settings({"ENGINEFARM_CACHE_QUOTA": raw}).cache_quota == expected


@pytest.mark.parametrize("raw", ["lots", "-5G", "0"])
def test_bad_quota_is_an_error(raw):
    with pytest.raises(ConfigError):
        load_settings({"ENGINEFARM_CACHE_QUOTA": raw})


def test_paths(tmp_path):
    settings = load_settings(
        {
            "ENGINEFARM_HOME": str(tmp_path / "h"),
            "ENGINEFARM_STORE": "s3://bucket/x",
            "ENGINEFARM_RECIPE_PATH": f"{tmp_path}/a:{tmp_path}/b",
        }
    )
    assert settings.home == tmp_path / "h" and settings.store == "s3://bucket/x"
    assert settings.recipe_path == (tmp_path / "a", tmp_path / "b")


def test_defaults_are_per_user_dirs():
    settings = load_settings({})
    assert "enginefarm" in str(settings.home) and "enginefarm" in settings.store


def test_cli_reports_bad_env_in_one_line(cli):
    proc = cli("cache", "gc", env={"ENGINEFARM_CACHE_QUOTA": "lots"})
    assert proc.returncode == 1 and proc.stderr.startswith("error: ENGINEFARM_CACHE_QUOTA='lots' is not a size")


def test_transfer_settings():
    settings = load_settings(
        {
            "ENGINEFARM_HTTP_DEADLINE": "60",
            "ENGINEFARM_HTTP_MIN_RATE": "1000",
            "ENGINEFARM_HTTP_CONNECTIONS": "4",
            "ENGINEFARM_S3_VERIFY": "1",
        }
    )
    assert (settings.http_deadline_s, settings.http_min_rate, settings.http_connections, settings.s3_verify) == (
        60,
        1000,
        4,
        True,
    )
    assert load_settings({}).http_connections == 1 and load_settings({}).s3_verify is False


@pytest.mark.parametrize(
    "name,raw",
    [("ENGINEFARM_HTTP_CONNECTIONS", "100"), ("ENGINEFARM_HTTP_DEADLINE", "soon"), ("ENGINEFARM_HTTP_MIN_RATE", "-1")],
)
def test_bad_transfer_settings(name, raw):
    with pytest.raises(ConfigError, match=name):
        load_settings({name: raw})


def test_release_channel_settings(tmp_path):
    settings = load_settings({"ENGINEFARM_CHANNEL": " stable ", "ENGINEFARM_TRUSTED_ROOT": str(tmp_path / "root.json")})
    assert settings.channel == "stable" and settings.trusted_root == tmp_path / "root.json"
    assert load_settings({}).channel is None and load_settings({}).trusted_root is None


@pytest.mark.parametrize(
    "raw,expected",
    [("", "ALL"), ("cpu_only", "CPU_ONLY"), (" CPU_AND_NE ", "CPU_AND_NE"), ("CPU_AND_GPU", "CPU_AND_GPU")],
)
def test_coreml_compute_units(raw, expected):
    assert load_settings({"ENGINEFARM_COREML_COMPUTE_UNITS": raw}).coreml_compute_units == expected


def test_unknown_coreml_compute_units_are_an_error():
    with pytest.raises(ConfigError, match="ENGINEFARM_COREML_COMPUTE_UNITS='GPU'") as caught:
        load_settings({"ENGINEFARM_COREML_COMPUTE_UNITS": "GPU"})
    assert "CPU_AND_GPU" in caught.value.hint


@pytest.mark.parametrize("raw,expected", [("", 64 << 30), ("1G", 1 << 30), ("500M", 500 << 20)])
def test_max_artifact_size_parsing(raw, expected):
    assert load_settings({"ENGINEFARM_MAX_ARTIFACT_SIZE": raw}).max_artifact_size == expected


@pytest.mark.parametrize("raw", ["huge", "0", "-1G"])
def test_bad_max_artifact_size_is_an_error(raw):
    with pytest.raises(ConfigError, match="ENGINEFARM_MAX_ARTIFACT_SIZE"):
        load_settings({"ENGINEFARM_MAX_ARTIFACT_SIZE": raw})


@pytest.mark.parametrize("raw,expected", [("", "auto"), ("auto", "auto"), ("ON", "on"), ("off", "off")])
def test_on_device_timing_setting(raw, expected):
    assert load_settings({"ENGINEFARM_MEASURE": raw}).measure == expected


def test_bad_on_device_timing_setting_is_an_error():
    with pytest.raises(ConfigError, match="ENGINEFARM_MEASURE='1'"):
        load_settings({"ENGINEFARM_MEASURE": "1"})


def test_host_lock_dir(tmp_path):
    assert load_settings({}).host_lock_dir is None
    assert load_settings({"ENGINEFARM_HOST_LOCK_DIR": str(tmp_path)}).host_lock_dir == tmp_path


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_home_that_is_a_file_or_under_one_is_named(where, tmp_path):
    (tmp_path / "f").write_text("not a folder")
    home = tmp_path / "f" if where == "a file" else tmp_path / "f" / "cache"
    with pytest.raises(ConfigError, match=r"^ENGINEFARM_HOME=.* is a file, not a folder$") as caught:
        load_settings({"ENGINEFARM_HOME": str(home)})
    assert caught.value.hint and (tmp_path / "f").read_text() == "not a folder"
