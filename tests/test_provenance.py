"""torchmover.runtime.provenance: the description of the run that produced a file."""
import hashlib
import json
import platform
import re
import subprocess

from torchmover.runtime import provenance


def git_repository(root, files: dict[str, str]):
    """A git repository in ``root`` with ``files`` committed; its commit."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "c"]):
        subprocess.run([*git, *args], cwd=root, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()


def test_checkout_state_names_the_commit_and_whether_tracked_files_changed(tmp_path):
    commit = git_repository(tmp_path, {"code.py": "0\n", "results/r.json": "0\n"})
    assert provenance.checkout_state(tmp_path) == (commit, False)
    (tmp_path / "untracked.txt").write_text("new")  # untracked files never count
    assert provenance.checkout_state(tmp_path) == (commit, False)
    (tmp_path / "results/r.json").write_text("1\n")
    assert provenance.checkout_state(tmp_path) == (commit, True)
    assert provenance.checkout_state(tmp_path, exclude=("results",)) == (commit, False)
    (tmp_path / "code.py").write_text("1\n")
    assert provenance.checkout_state(tmp_path, exclude=("results",)) == (commit, True)


def test_outside_a_checkout_the_commit_and_dirty_state_are_none(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above tmp_path
    assert provenance.checkout_state(tmp_path) == (None, None)
    record = provenance.run_provenance(tmp_path, "cpu")
    assert record["code"] == {"commit": None, "dirty": None}


def test_data_records_hash_files_and_the_files_of_directories(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.tsv").write_bytes(b"bb")
    (tmp_path / "d" / "sub" / "a.tsv").write_bytes(b"a")
    (tmp_path / "d" / ".hidden").write_bytes(b"x")
    (tmp_path / "one.tsv").write_bytes(b"one")
    records = provenance.data_records([tmp_path / "one.tsv", tmp_path / "d", "hub:some/data"])
    assert [(r["path"], r["bytes"], r["sha256"]) for r in records] == [
        (str(tmp_path / "one.tsv"), 3, hashlib.sha256(b"one").hexdigest()),
        (str(tmp_path / "d" / "b.tsv"), 2, hashlib.sha256(b"bb").hexdigest()),
        (str(tmp_path / "d" / "sub" / "a.tsv"), 1, hashlib.sha256(b"a").hexdigest()),
        ("hub:some/data", None, None),
    ]


def test_command_line_is_quoted_and_relative_to_the_root(tmp_path):
    script = tmp_path / "recipes" / "x.py"
    assert provenance.command_line([str(script), "--out", "a b"], tmp_path) == "python recipes/x.py --out 'a b'"
    assert provenance.command_line(["/elsewhere/y.py"], tmp_path) == "python /elsewhere/y.py"


def test_run_provenance_holds_every_field_and_is_json(tmp_path):
    commit = git_repository(tmp_path, {"recipes/x.py": "0\n"})
    (tmp_path / "data.tsv").write_text("lp\tscore\n")
    record = provenance.run_provenance(tmp_path, "cpu", [tmp_path / "data.tsv"],
                                       argv=[str(tmp_path / "recipes" / "x.py"), "--seed", "1"])
    assert json.loads(json.dumps(record)) == record
    assert record["command"] == "python recipes/x.py --seed 1"
    assert record["code"] == {"commit": commit, "dirty": False}  # data.tsv is untracked
    assert list(record["versions"]) == ["python", "torchmover", "torch", "transformers"]
    assert record["versions"]["python"] == platform.python_version() and record["versions"]["torch"]
    assert record["device"]["name"] == "cpu" and record["device"]["cores"] >= 1
    assert [r["bytes"] for r in record["data"]] == [len("lp\tscore\n")]


def test_a_missing_package_has_no_version():
    assert provenance.package_version("no-such-distribution-anywhere") is None
    assert re.fullmatch(r"\d+\.\d+.*", provenance.package_version("torch"))


def test_device_info_names_torch_threads_once_torch_is_imported():
    import torch

    assert provenance.device_info()["torch_threads"] == torch.get_num_threads()
