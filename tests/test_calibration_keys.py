"""A calibration belongs to the model's identity (resolved path or hub id and revision, plus
a hash of config.json), not to the name as typed."""

import json
import shutil

import pytest

import gemfilter
from gemfilter.layers import calibration_path, model_identity, model_key
from gemfilter.models import load_config
from gemfilter.toolkit.io import write_json_atomic


@pytest.fixture
def two_folders(tiny_model_dir, tmp_path, monkeypatch):
    """Folders a/ and b/, each holding a model named m (b's with one layer fewer), and a private cache."""
    monkeypatch.setenv("GEMFILTER_CACHE", str(tmp_path / "cache"))
    for name in ("a", "b"):
        shutil.copytree(tiny_model_dir, tmp_path / name / "m")
    config = json.loads((tmp_path / "b" / "m" / "config.json").read_text())
    (tmp_path / "b" / "m" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    return tmp_path


def store(config, layer):
    write_json_atomic(calibration_path(model_key(config)), {"model": model_key(config), "layer": layer})


def test_a_relative_model_in_another_folder_is_another_model(two_folders, monkeypatch):
    monkeypatch.chdir(two_folders / "a")
    a = load_config("m")
    key_a, rule = model_key(a), gemfilter.default_layer(a)
    store(a, 1)  # calibrated in a/: layer 1, not the rule's
    assert rule != 1 and gemfilter.default_layer(load_config("m")) == 1
    monkeypatch.chdir(two_folders / "b")
    b = load_config("m")  # the same name typed, another model
    assert model_key(b) != key_a and gemfilter.default_layer(b) != 1


def test_the_same_model_by_absolute_and_relative_path_has_one_key(two_folders, monkeypatch):
    monkeypatch.chdir(two_folders)
    relative, absolute = load_config("a/m"), load_config(str(two_folders / "a" / "m"))
    assert model_key(relative) == model_key(absolute)
    store(relative, 1)
    assert gemfilter.default_layer(absolute) == 1
    identity = model_identity(relative)
    assert identity["name"] == str((two_folders / "a" / "m").resolve())
    import hashlib

    assert (
        identity["config_sha"]
        == hashlib.sha256((two_folders / "a" / "m" / "config.json").read_bytes()).hexdigest()[:16]
    )


def test_an_edited_config_is_another_model(two_folders, monkeypatch):
    monkeypatch.chdir(two_folders)
    before = model_key(load_config("a/m"))
    path = two_folders / "a" / "m" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rms_norm_eps": 1e-5}))
    assert model_key(load_config("a/m")) != before


def test_a_calibration_stored_under_an_absolute_path_before_identity_keys_is_still_read(two_folders):
    path = str(two_folders / "a" / "m")
    write_json_atomic(calibration_path(path), {"model": path, "layer": 1})  # the old key: the name as typed
    assert gemfilter.default_layer(load_config(path)) == 1
