"""The zoo manifest, fetching with checksums, materialisation and synthetic models."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import REAL_MODELS, test_cache_dir
from tests.workers.fakes import write_manifest
from workers.measure.sessions import make_session, run_session
from workers.zoo.fetch import cached_download_path, fetch_entry
from workers.zoo.inputs import SpecError, check_spec, make_feeds
from workers.zoo.manifest import ZooError, load_zoo
from workers.zoo.materialise import light_model_source, materialise
from workers.zoo.registry import FetchError, fetch_wheel_member
from workers.zoo.synthetic import GENERATORS, generate, synthetic_model_path


def test_shipped_manifest_has_the_required_entries() -> None:
    zoo = load_zoo()
    for name in ("silero_vad", "ppocr_v4_rec", "ppocr_mobile_cls", "transformer_block", "conv_net", "loop_if",
                 "stateful_rnn"):
        assert name in zoo.entries
    assert any(e.source.kind == "onnx_light" for e in zoo.entries.values())
    for name, (package, member, sha) in REAL_MODELS.items():  # the manifest and the test fixtures agree
        e = zoo.get(name)
        assert (e.source.ref, e.source.member, e.sha256) == (package, member, sha)
    silero = zoo.get("silero_vad")
    assert silero.stateful is not None and silero.stateful.state == {"state": "stateN"}
    assert {i.name: i.shape for i in silero.inputs} == {"input": (1, 512), "state": (2, 1, 128), "sr": ()}
    assert 2 <= len(zoo.select(tag="smoke")) <= 4
    assert zoo.get("ppocr_mobile_cls").task == "top1"
    assert zoo.get("conv_net").tolerance_for("bf16").atol > zoo.get("conv_net").tolerance_for("fp16").atol
    with pytest.raises(ZooError, match="unknown model 'nope'.*silero_vad"):
        zoo.get("nope")


@pytest.mark.parametrize(("body", "match"), [
    ('[models.a]\nsource = { path = "a.onnx" }\ninputs.x = { shape = [1] }\n', "need a sha256"),
    ('[models.a]\nsource = { synthetic = "conv_net" }\ninputs.x = { shape = [1], dtype = "f32" }\n', "unknown dtype"),
    ('[models.a]\nsource = { synthetic = "conv_net" }\ninputs.x = { shape = [1] }\ncolour = 1\n', "unknown key"),
    ('[models.a]\nsource = { synthetic = "conv_net", path = "x" }\ninputs.x = { shape = [1] }\n', "exactly one"),
    ('[models.a]\nsource = { package = "foo", member = "m" }\nsha256 = "' + "0" * 64 + '"\ninputs = {}\n',
     "name==version"),
    ('[models.a\n', "not valid TOML"),
])
def test_malformed_manifests_fail_with_a_precise_message(tmp_path: Path, body: str, match: str) -> None:
    with pytest.raises(ZooError, match=match):
        load_zoo(write_manifest(tmp_path / "zoo.toml", body))


def test_url_fetch_verifies_checksum_deletes_bad_file_and_never_refetches(tmp_path: Path) -> None:
    data = generate("stateful_rnn", 0).SerializeToString()
    src = tmp_path / "store" / "m.onnx"
    src.parent.mkdir()
    src.write_bytes(data)
    good = hashlib.sha256(data).hexdigest()
    bad = "f" * 64
    man = write_manifest(tmp_path / "zoo.toml", f'''
        [models.good]
        source = {{ url = "file://{src}" }}
        sha256 = "{good}"
        inputs.x = {{ shape = [1, 8] }}
        inputs.h = {{ shape = [1, 32] }}
        [models.bad]
        source = {{ url = "file://{src}" }}
        sha256 = "{bad}"
        inputs.x = {{ shape = [1, 8] }}
    ''')
    zoo, cache = load_zoo(man), tmp_path / "cache"
    with pytest.raises(FetchError, match=f"checksum mismatch.*expected {bad}.*deleted"):
        fetch_entry(zoo.get("bad"), cache)
    assert not cached_download_path(cache, bad, str(src)).exists()
    assert not list((cache / "files").rglob("*.part"))
    first = fetch_entry(zoo.get("good"), cache)
    assert first.sha256 == good and first.path.read_bytes() == data
    src.unlink()  # the source is gone: a second fetch must come from the cache
    assert fetch_entry(zoo.get("good"), cache) == first


def test_local_path_mismatch_is_reported_and_the_file_kept(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"not a model")
    man = write_manifest(tmp_path / "zoo.toml", f'''
        [models.m]
        source = {{ path = "m.onnx" }}
        sha256 = "{"0" * 64}"
        inputs.x = {{ shape = [1] }}
    ''')
    with pytest.raises(FetchError, match="checksum mismatch"):
        fetch_entry(load_zoo(man).get("m"), tmp_path / "cache")
    assert (tmp_path / "m.onnx").exists()


def test_registry_member_checksum_mismatch_deletes_the_extracted_file(tmp_path: Path) -> None:
    package, member, sha = REAL_MODELS["ppocr_mobile_cls"]
    wheels = list((test_cache_dir() / "wheels").glob("rapidocr_onnxruntime-1.4.4*.whl"))
    if not wheels:
        pytest.skip("rapidocr wheel not in the shared cache (fetched by the realmodel tests)")
    (tmp_path / "wheels").mkdir()
    shutil.copy(wheels[0], tmp_path / "wheels" / wheels[0].name)
    wrong = "0" * 64
    with pytest.raises(FetchError, match="checksum mismatch"):
        fetch_wheel_member(package, member, wrong, tmp_path)
    assert not any(p.is_file() for p in (tmp_path / "files").rglob("*"))
    assert fetch_wheel_member(package, member, sha, tmp_path).is_file()


def test_synthetic_models_are_deterministic_and_cached(tmp_path: Path) -> None:
    for name in GENERATORS:
        a, b = generate(name, 0).SerializeToString(), generate(name, 0).SerializeToString()
        assert a == b, name
        assert generate(name, 1).SerializeToString() != a, name
    path, sha = synthetic_model_path("conv_net", 0, tmp_path)
    mtime = path.stat().st_mtime_ns
    assert synthetic_model_path("conv_net", 0, tmp_path) == (path, sha) and path.stat().st_mtime_ns == mtime
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha


def test_materialised_light_model_has_real_weights_and_runs(tmp_path: Path) -> None:
    src = onnx.load(light_model_source("light_squeezenet"))
    m1, m2 = materialise(src, seed=0), materialise(src, seed=0)
    assert m1.SerializeToString() == m2.SerializeToString()
    assert not any(n.op_type == "ConstantOfShape" for n in m1.graph.node)
    assert [i.name for i in m1.graph.input] == ["data_0"]
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in m1.graph.initializer}
    assert weights["conv1_w_0"].shape == (64, 3, 3, 3) and weights["conv1_w_0"].std() > 0.01
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    prob = next(iter(run_session(make_session(m1), {"data_0": x}).values()))
    assert np.isfinite(prob).all() and 0.001 < prob.max() < 0.999  # neither uniform nor one-hot
    with pytest.raises(FetchError, match="no light model.*light_resnet50"):
        light_model_source("light_nope")


def test_input_spec_is_checked_against_the_model(tmp_path: Path) -> None:
    model = generate("stateful_rnn", 0)
    base = '[models.m]\nsource = { synthetic = "stateful_rnn" }\n'
    ok = load_zoo(write_manifest(tmp_path / "a.toml", base + 'inputs.x = { shape = [1, 8] }\n'
                                 'inputs.h = { shape = [1, 32], dist = "zeros" }\n')).get("m")
    check_spec(ok, model)
    feeds = make_feeds(ok, seed=3)
    assert feeds["x"].dtype == np.float32 and feeds["h"].shape == (1, 32) and not feeds["h"].any()
    assert np.array_equal(make_feeds(ok, seed=3)["x"], feeds["x"])
    assert not np.array_equal(make_feeds(ok, seed=3, step=1)["x"], feeds["x"])
    for body, match in [('inputs.x = { shape = [1, 8] }\ninputs.state = { shape = [1, 32] }\n',
                         "without a spec: h; specs for inputs the model does not have: state"),
                        ('inputs.x = { shape = [1, 9] }\ninputs.h = { shape = [1, 32] }\n', "'x' dim 1 is 8"),
                        ('inputs.x = { shape = [8] }\ninputs.h = { shape = [1, 32] }\n', "rank 2"),
                        ('inputs.x = { shape = [1, 8], dtype = "int64" }\ninputs.h = { shape = [1, 32] }\n',
                         "float32 in the model")]:
        entry = load_zoo(write_manifest(tmp_path / "b.toml", base + body)).get("m")
        with pytest.raises(SpecError, match=match):
            check_spec(entry, model)


def test_selecting_an_unknown_tag_is_an_error_naming_the_tags() -> None:
    from workers.zoo.manifest import ZooError, load_zoo

    zoo = load_zoo()
    assert {e.name for e in zoo.select(None, "smoke")} >= {"conv_net"}
    with pytest.raises(ZooError, match=r"no zoo model has tag 'nosuchtag'; tags: .*smoke"):
        zoo.select(None, "nosuchtag")
