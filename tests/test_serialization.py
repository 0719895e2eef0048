"""Scorer.save_pretrained / Scorer.from_pretrained."""
import json
import os

import pytest
import torch

from torchmover import Scorer

HYPS = ["the cat sat on the mat", "a dog barked", "the sun is red"]
REFS = ["a cat was on the mat", ["the dog barked", "a dog runs"], "the moon is blue"]
CORPUS = ["the cat sat on the mat", "a dog barked at night", "the quick brown fox jumps", "we ran to the city"]


@pytest.fixture
def fitted(tiny_encoder):
    return Scorer(tiny_encoder, centering="fixed", method="twmd", direction="f1", temperature=0.2,
                  n_iter=3, multi_ref="mean").fit_centering(CORPUS, progress=False)


def test_round_trip_scores_and_signature_are_identical(fitted, tmp_path):
    fitted.save_pretrained(tmp_path / "scorer")
    loaded = Scorer.from_pretrained(tmp_path / "scorer")
    assert sorted(os.listdir(tmp_path)) == ["scorer"]  # no temporary directory left behind
    assert sorted(os.listdir(tmp_path / "scorer")) == ["centering.safetensors", "encoder", "torchmover.json"]
    assert loaded.config == fitted.config
    assert loaded.signature == fitted.signature  # keeps the original model name and the mean's digest
    assert torch.equal(loaded.centering.mean, fitted.centering.mean)
    assert int(loaded.centering.num_tokens) == int(fitted.centering.num_tokens)
    with torch.no_grad():
        assert torch.equal(loaded(HYPS, REFS), fitted(HYPS, REFS))
    # the encoder was saved cut at its layer and reloads as such
    assert loaded.encoder.model.config.num_hidden_layers == fitted.encoder.layer == loaded.encoder.layer
    assert loaded.encoder.max_length == fitted.encoder.max_length


def test_torchmover_json_holds_the_config_and_version(fitted, tmp_path):
    import torchmover

    fitted.save_pretrained(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "torchmover.json").read_text())
    assert meta["torchmover"] == torchmover.__version__
    assert meta["config"]["model"] == "tiny-bert" and meta["config"]["layer"] == 2
    assert meta["config"]["centering"] == "fixed"


def test_batch_centering_round_trip_and_reloading_into_a_cut_encoder(tiny_encoder, tmp_path):
    scorer = Scorer(tiny_encoder)  # batch centering: empty buffers are saved too
    scorer.save_pretrained(tmp_path / "s")
    loaded = Scorer.from_pretrained(tmp_path / "s")
    with torch.no_grad():
        assert torch.equal(loaded(HYPS, REFS), scorer(HYPS, REFS))
    loaded.save_pretrained(tmp_path / "again")  # a reloaded (already cut) encoder saves and reloads
    with torch.no_grad():
        assert torch.equal(Scorer.from_pretrained(tmp_path / "again")(HYPS, REFS), scorer(HYPS, REFS))


@pytest.mark.parametrize("layer", [0, 1, 3])
def test_round_trip_at_any_layer(layer, tmp_path):
    from conftest import tiny_model, tiny_tokenizer
    from torchmover import Encoder

    scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=layer, name="tiny-bert"), method="bertscore")
    scorer.save_pretrained(tmp_path / "s")
    loaded = Scorer.from_pretrained(tmp_path / "s")
    assert loaded.encoder.layer == layer and loaded.signature == scorer.signature
    with torch.no_grad():
        assert torch.equal(loaded(HYPS, REFS), scorer(HYPS, REFS))


def test_saving_over_an_earlier_save_replaces_it(fitted, tiny_encoder, tmp_path):
    Scorer(tiny_encoder, method="bertscore").save_pretrained(tmp_path / "s")
    fitted.save_pretrained(tmp_path / "s")
    assert Scorer.from_pretrained(tmp_path / "s").config == fitted.config
    assert sorted(os.listdir(tmp_path)) == ["s"]


def test_saving_into_a_directory_keeps_the_files_already_there(fitted, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("keep me")
    fitted.save_pretrained(tmp_path / "data")
    assert (tmp_path / "data" / "notes.txt").read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["data"]
    assert Scorer.from_pretrained(tmp_path / "data").config == fitted.config


def test_resaving_keeps_user_files_and_removes_only_the_earlier_saves_stale_files(fitted, tiny_encoder, tmp_path):
    refs, hyps = ["the cat sat", "a dog barked"], ["a cat sat", "the dog barked"]
    Scorer(tiny_encoder, idf=True).fit_idf(refs, hyps).save_pretrained(tmp_path / "s")
    (tmp_path / "s" / "notes.txt").write_text("keep me")
    (tmp_path / "s" / "encoder" / "README.md").write_text("my model card")
    fitted.save_pretrained(tmp_path / "s")  # writes no idf.json
    assert (tmp_path / "s" / "notes.txt").read_text() == "keep me"
    assert (tmp_path / "s" / "encoder" / "README.md").read_text() == "my model card"
    assert not (tmp_path / "s" / "idf.json").exists()  # written by the earlier save, unchanged: removed
    assert Scorer.from_pretrained(tmp_path / "s").config == fitted.config


def test_resaving_keeps_a_stale_file_the_user_changed(fitted, tiny_encoder, tmp_path):
    Scorer(tiny_encoder, idf=True).fit_idf(["a b"], ["b c"]).save_pretrained(tmp_path / "s")
    (tmp_path / "s" / "idf.json").write_text('{"edited": true}')
    with pytest.warns(UserWarning, match="idf.json.*changed since"):
        fitted.save_pretrained(tmp_path / "s")
    assert (tmp_path / "s" / "idf.json").read_text() == '{"edited": true}'
    loaded = Scorer.from_pretrained(tmp_path / "s")  # the stale file is not part of the new save
    assert loaded.config == fitted.config and not loaded.idf


@pytest.mark.parametrize("blocker", ["centering.safetensors", "encoder/config.json", "encoder"])
def test_refuses_to_overwrite_files_no_save_wrote_and_names_them(fitted, tmp_path, blocker):
    target = tmp_path / "data"
    (target / blocker).parent.mkdir(parents=True, exist_ok=True)
    (target / blocker).write_text("mine")
    with pytest.raises(FileExistsError, match=blocker):
        fitted.save_pretrained(target)
    assert (target / blocker).read_text() == "mine"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == sorted(
        ["data", f"data/{blocker}"] + (["data/encoder"] if "/" in blocker else []))


def test_a_save_that_fails_while_moving_files_in_leaves_no_loadable_mixture(fitted, tiny_encoder, tmp_path,
                                                                              monkeypatch):
    import torchmover.scorer.serialization as serialization

    Scorer(tiny_encoder, method="bertscore").save_pretrained(tmp_path / "s")
    (tmp_path / "s" / "notes.txt").write_text("keep me")
    moved = []

    def replace_then_fail(src, dst):
        if moved:
            raise OSError("disk full")
        moved.append(dst)
        os.rename(src, dst)

    monkeypatch.setattr(serialization.os, "replace", replace_then_fail)
    with pytest.raises(OSError, match="disk full"):
        fitted.save_pretrained(tmp_path / "s")
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match="torchmover.json is missing"):
        Scorer.from_pretrained(tmp_path / "s")
    assert (tmp_path / "s" / "notes.txt").read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["s"]  # the staging directory is gone
    fitted.save_pretrained(tmp_path / "s")  # a retry completes the save
    assert Scorer.from_pretrained(tmp_path / "s").config == fitted.config


def test_torchmover_json_records_the_sha256_of_every_file_written(fitted, tmp_path):
    import hashlib

    fitted.save_pretrained(tmp_path / "s")
    files = json.loads((tmp_path / "s" / "torchmover.json").read_text())["files"]
    on_disk = sorted(p.relative_to(tmp_path / "s").as_posix() for p in (tmp_path / "s").rglob("*")
                     if p.is_file() and p.name != "torchmover.json")
    assert sorted(files) == on_disk and "encoder/model.safetensors" in files
    for name, digest in files.items():
        assert hashlib.sha256((tmp_path / "s" / name).read_bytes()).hexdigest() == digest


def test_a_flipped_byte_in_the_weights_is_an_error_naming_the_file(fitted, tmp_path):
    fitted.save_pretrained(tmp_path / "s")
    weights = tmp_path / "s" / "encoder" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    start = 8 + int.from_bytes(data[:8], "little") + header["embeddings.LayerNorm.weight"]["data_offsets"][0]
    data[start + 3] ^= 0x01  # one bit of the exponent of a LayerNorm gain: the file still parses
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.safetensors.*does not match its SHA-256"):
        Scorer.from_pretrained(tmp_path / "s")
    with torch.no_grad():  # verify=False loads it: the corruption is real (scores differ)
        assert not torch.equal(Scorer.from_pretrained(tmp_path / "s", verify=False)(HYPS, REFS), fitted(HYPS, REFS))


def test_a_save_without_hashes_loads_only_with_verify_false(fitted, tmp_path):
    fitted.save_pretrained(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "torchmover.json").read_text())
    del meta["files"], meta["manifest_sha256"]  # as an older torchmover wrote it
    (tmp_path / "s" / "torchmover.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="records no SHA-256 of its own content.*verify=False"):
        Scorer.from_pretrained(tmp_path / "s")
    assert Scorer.from_pretrained(tmp_path / "s", verify=False).config == fitted.config


def test_a_failed_save_leaves_nothing_behind(fitted, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(fitted.encoder.tokenizer, "save_pretrained", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        fitted.save_pretrained(tmp_path / "s")
    assert os.listdir(tmp_path) == []


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        Scorer.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="torchmover.json is missing"):
        Scorer.from_pretrained(tmp_path)


@pytest.mark.parametrize("damage, error, match", [
    (lambda p: (p / "torchmover.json").write_text("{not json"), ValueError, r"corrupt '.*torchmover\.json'"),
    (lambda p: (p / "torchmover.json").write_text('{"format": 99, "config": {}}'), ValueError, "format 99"),
    (lambda p: _edit_config(p, method="nope"), ValueError, "invalid config.*method"),
    (lambda p: _edit_config(p, colour="red"), ValueError, "unknown config fields"),
    (lambda p: (p / "centering.safetensors").unlink(), FileNotFoundError, "centering.safetensors is missing"),
    (lambda p: (p / "encoder" / "model.safetensors").unlink(), FileNotFoundError, "model.safetensors is missing"),
    (lambda p: (p / "centering.safetensors").write_bytes(b"\x00garbage"), ValueError, "centering.safetensors.*SHA-256"),
    (lambda p: _edit_config(p, files={"../outside": "0"}), ValueError, "outside the saved scorer"),
])
def test_corrupt_directory_gives_a_clear_error(fitted, tmp_path, damage, error, match):
    fitted.save_pretrained(tmp_path / "s")
    damage(tmp_path / "s")
    with pytest.raises(error, match=match):
        Scorer.from_pretrained(tmp_path / "s")


def _set_json(file, key, value):
    data = json.loads(file.read_text())
    data[key] = value
    file.write_text(json.dumps(data))


@pytest.mark.parametrize("damage, file, match", [
    (lambda p: (p / "centering.safetensors").write_bytes(b"\x00garbage"), "centering.safetensors", "corrupt"),
    (lambda p: (p / "encoder" / "model.safetensors").write_bytes(b"garbage"), "encoder/model.safetensors", "corrupt"),
    (lambda p: (p / "encoder" / "model.safetensors").unlink(), "encoder/config.json", "cannot load the encoder"),
    (lambda p: (p / "encoder" / "tokenizer.json").write_bytes(b"\x84" + (p / "encoder" / "tokenizer.json").read_bytes()),
     "encoder/tokenizer.json", "corrupt .*'utf-8' codec can't decode byte 0x84"),  # the message, now with its file
    (lambda p: _set_json(p / "encoder" / "config.json", "hidden_size", 48), "encoder/config.json",
     "cannot load the encoder"),  # weights of another size: transformers' ignore_mismatched_sizes error
    (lambda p: _set_json(p / "encoder" / "tokenizer.json", "model", {"type": "nope"}), "encoder",
     "cannot load the tokenizer .*tokenizer.json"),
    (lambda p: _set_json(p / "encoder" / "config.json", "num_hidden_layers", 1), "encoder/config.json",
     "unexpected tensors .*encoder.layer.1"),  # strict loading: the weights of a layer the config lacks
    (lambda p: _edit_config(p, layer=9), "torchmover.json", "does not fit the config in"),
])
def test_corrupt_files_give_errors_naming_the_file_without_verification(fitted, tmp_path, damage, file, match):
    import re

    fitted.save_pretrained(tmp_path / "s")
    damage(tmp_path / "s")
    with pytest.raises(ValueError, match=match) as error:
        Scorer.from_pretrained(tmp_path / "s", verify=False)
    assert str(tmp_path / "s" / file) in str(error.value), str(error.value)
    with pytest.raises((ValueError, FileNotFoundError), match=re.escape(str(tmp_path / "s"))):
        Scorer.from_pretrained(tmp_path / "s")  # and with verification (that names the file too)


@pytest.mark.parametrize("old, new", [(b'"temperature": 0.2', b'"temperature": 0.3'), (b'"layer": 2', b'"layer": 3')])
def test_a_changed_value_in_torchmover_json_is_an_error_naming_it(fitted, tmp_path, old, new):
    fitted.save_pretrained(tmp_path / "s")
    manifest = tmp_path / "s" / "torchmover.json"
    assert manifest.read_bytes().count(old) == 1 and bin(old[-1] ^ new[-1]).count("1") == 1  # one flipped bit
    manifest.write_bytes(manifest.read_bytes().replace(old, new))
    with pytest.raises(ValueError, match=r"torchmover\.json' does not match its own SHA-256"):
        Scorer.from_pretrained(tmp_path / "s")


def test_a_flipped_bit_in_a_recorded_digest_blames_torchmover_json_not_the_intact_file(fitted, tmp_path):
    fitted.save_pretrained(tmp_path / "s")
    manifest = tmp_path / "s" / "torchmover.json"
    digest = json.loads(manifest.read_text())["files"]["encoder/model.safetensors"]
    flipped = format(int(digest[0], 16) ^ 1, "x") + digest[1:]
    manifest.write_text(manifest.read_text().replace(digest, flipped))
    with pytest.raises(ValueError, match=r"torchmover\.json' does not match its own SHA-256"):
        Scorer.from_pretrained(tmp_path / "s")


def test_reformatting_torchmover_json_keeps_it_valid(fitted, tmp_path):
    fitted.save_pretrained(tmp_path / "s")
    manifest = tmp_path / "s" / "torchmover.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()), indent=7, sort_keys=True))
    assert Scorer.from_pretrained(tmp_path / "s").config == fitted.config


def test_refuses_to_overwrite_a_torchmover_json_no_save_wrote(fitted, tmp_path):
    """A user's own torchmover.json is in the way, even one that lists files (which a save would
    otherwise take for its own and delete)."""
    import hashlib

    target = tmp_path / "mine"
    target.mkdir()
    (target / "data.csv").write_text("a,b\n1,2\n")
    own = json.dumps({"format": 1, "files": {"data.csv": hashlib.sha256(b"a,b\n1,2\n").hexdigest()}})
    (target / "torchmover.json").write_text(own)
    with pytest.raises(FileExistsError, match=r"\['torchmover\.json'\]"):
        fitted.save_pretrained(target)
    assert (target / "torchmover.json").read_text() == own and (target / "data.csv").read_text() == "a,b\n1,2\n"
    assert sorted(os.listdir(target)) == ["data.csv", "torchmover.json"]


def test_a_save_over_an_earlier_save_whose_torchmover_json_was_changed_refuses(fitted, tmp_path):
    fitted.save_pretrained(tmp_path / "s")
    manifest = tmp_path / "s" / "torchmover.json"
    manifest.write_text(manifest.read_text().replace('"temperature": 0.2', '"temperature": 0.3'))
    with pytest.raises(FileExistsError, match="torchmover.json"):
        fitted.save_pretrained(tmp_path / "s")


@pytest.mark.parametrize("link", ["encoder", "."])
def test_refuses_to_write_through_a_symlinked_folder(fitted, tmp_path, link):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = tmp_path / "s"
    if link == ".":  # the target itself may be a link: the user named it
        target.symlink_to(elsewhere, target_is_directory=True)
        fitted.save_pretrained(target)
        assert (elsewhere / "torchmover.json").is_file()
        return
    target.mkdir()
    (target / "encoder").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(FileExistsError, match=r"\['encoder'\]"):
        fitted.save_pretrained(target)
    assert os.listdir(elsewhere) == [] and sorted(os.listdir(target)) == ["encoder"]


def killed_while_saving(model_dir, target) -> None:
    """Save a scorer to ``target`` in a process killed (SIGKILL: no cleanup runs) once every file is
    staged, before any is moved into ``target``."""
    import subprocess
    import sys

    code = ("import os, signal\n"
            "import torchmover.scorer.serialization as serialization\n"
            "from torchmover import Scorer\n"
            "serialization._install = lambda *args: os.kill(os.getpid(), signal.SIGKILL)\n"
            f"Scorer(model={str(model_dir)!r}, layer=2, device='cpu').save_pretrained({str(target)!r})\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=300).returncode == -9


def test_the_next_save_removes_the_staging_directory_of_a_killed_save_and_only_that(fitted, tmp_path, tiny_model_dir):
    from torchmover.runtime.checkpoint import staging_directory

    killed_while_saving(tiny_model_dir, tmp_path / "s")
    assert os.listdir(tmp_path / "s") == []  # the directory the save held (its lock), nothing in it
    staged = [p.name for p in tmp_path.iterdir() if p.name != "s"]
    assert len(staged) == 1 and staged[0].startswith(".s.tmp-")  # what the issue saw pile up
    assert (tmp_path / staged[0] / "encoder" / "model.safetensors").is_file()
    (tmp_path / ".s.tmp-mine").mkdir()  # a folder of that name that no save made: kept
    (tmp_path / ".s.tmp-mine" / "notes.txt").write_text("keep me")
    with staging_directory(tmp_path, ".s.tmp-") as in_progress:  # a save of s in progress elsewhere: kept
        fitted.save_pretrained(tmp_path / "s")
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".s.tmp-mine", in_progress.name, "s"])
    assert sorted(os.listdir(tmp_path)) == [".s.tmp-mine", "s"]
    assert Scorer.from_pretrained(tmp_path / "s").config == fitted.config


def _edit_config(path, files=None, **changes):
    """Change torchmover.json and record its new digest (as a save would have written it)."""
    from torchmover.scorer.serialization import manifest_digest

    meta = json.loads((path / "torchmover.json").read_text())
    meta["config"].update(changes)
    if files is not None:
        meta["files"] = files
    meta["manifest_sha256"] = manifest_digest(meta)
    (path / "torchmover.json").write_text(json.dumps(meta))


def test_round_trip_keeps_the_token_policy_and_idf(tiny_encoder, tmp_path):
    from torchmover import Scorer

    refs = ["the cat sat on the mat", "a dog barked", "the sun is red"]
    hyps = ["a cat sat", "the dog barked loudly", "the moon is red"]
    scorer = Scorer(tiny_encoder, idf=True, subwords="first", stopwords="english", ngram=2).fit_idf(refs, hyps)
    scorer.save_pretrained(tmp_path / "s")
    loaded = Scorer.from_pretrained(tmp_path / "s")
    assert loaded.signature == scorer.signature and loaded.config == scorer.config
    with torch.no_grad():
        torch.testing.assert_close(loaded(hyps, refs), scorer(hyps, refs))


def _train_step(scorer) -> None:
    """What an optimiser step does to the encoder's weights."""
    with torch.no_grad():
        next(scorer.encoder.model.parameters()).add_(0.01)


def test_trained_weights_that_the_signature_does_not_pin_are_not_saved(tiny_model_dir, tmp_path):
    """Weights changed since mark_finetuned, or trained without it, would be saved under a signature
    that pins other weights (the pristine model's, which from_signature would rebuild): refused before
    anything is written, naming mark_finetuned. Marked again, they save, and the loaded scorer's
    finetuned digest is that of the weights it holds; it saves again as it is."""
    from torchmover.text.encoder import weights_digest

    scorer = Scorer(str(tiny_model_dir), layer=2)
    _train_step(scorer)
    with pytest.raises(ValueError, match=r"are not those the scorer was built with .*call scorer.mark_finetuned\(on\)"):
        scorer.save_pretrained(tmp_path / "unmarked")
    scorer.mark_finetuned("wmt-da")
    _train_step(scorer)
    with pytest.raises(ValueError, match=r"changed after mark_finetuned\('wmt-da'\).*call mark_finetuned again"):
        scorer.save_pretrained(tmp_path / "stale")
    assert not (tmp_path / "unmarked").exists() and not (tmp_path / "stale").exists()
    scorer.mark_finetuned("wmt-da").save_pretrained(tmp_path / "tuned")
    loaded = Scorer.from_pretrained(tmp_path / "tuned")
    assert loaded.finetuned == f"wmt-da@weights-{weights_digest(loaded.encoder.model)}"
    loaded.save_pretrained(tmp_path / "again")
    assert Scorer.from_pretrained(tmp_path / "again").signature == scorer.signature


def test_weights_as_built_save_in_any_dtype_and_a_later_conversion_is_named(tiny_model_dir, tmp_path):
    """A scorer built in float64 pins those weights (its signature says dtype:float64); one converted after
    it was built cannot be checked against what its signature pins, and the refusal says so."""
    Scorer(str(tiny_model_dir), layer=2, dtype="float64").save_pretrained(tmp_path / "double")
    assert Scorer.from_pretrained(tmp_path / "double").encoder.dtype == torch.float64
    converted = Scorer(str(tiny_model_dir), layer=2).double()
    with pytest.raises(ValueError, match="converted from torch.float32 to torch.float64"):
        converted.save_pretrained(tmp_path / "converted")


def test_a_fine_tuned_scorer_says_so_in_its_signature_and_keeps_it_when_saved(tmp_path):
    """mark_finetuned pins what the encoder was trained on and its weights' digest, after the model it
    started from; saving and loading keeps it; a signature of it cannot be rebuilt from the hub."""
    from conftest import tiny_model, tiny_tokenizer
    from torchmover import Encoder

    scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), 2, name="tiny-bert"))
    untuned = scorer.signature
    assert scorer.finetuned is None and "finetuned:" not in untuned
    _train_step(scorer)
    scorer.mark_finetuned("wmt15-da-1790pairs")
    assert scorer.finetuned.startswith("wmt15-da-1790pairs@weights-")
    assert scorer.signature.startswith(f"twmd|model:tiny-bert|finetuned:{scorer.finetuned}|layer:2|")
    assert scorer.signature.replace(f"|finetuned:{scorer.finetuned}", "") == untuned
    first = scorer.finetuned
    _train_step(scorer)
    assert scorer.mark_finetuned("wmt15-da-1790pairs").finetuned != first  # other weights, another digest
    scorer.save_pretrained(tmp_path / "tuned")
    loaded = Scorer.from_pretrained(tmp_path / "tuned")
    assert loaded.finetuned == scorer.finetuned and loaded.signature == scorer.signature
    with pytest.raises(ValueError, match="fine-tuned on wmt15-da-1790pairs.*Scorer.from_pretrained"):
        Scorer.from_signature(loaded.signature)
    for bad in ("", "wmt 15", "a|b", None):
        with pytest.raises(ValueError, match="without whitespace"):
            scorer.mark_finetuned(bad)


def test_two_saves_into_one_directory_end_with_one_complete_save_and_a_clear_error(fitted, tmp_path):
    """Before, two processes saving into one directory raised a bare FileNotFoundError for
    .torchmover-saving.json in 10 of 12 rounds."""
    import fcntl
    import threading

    target = tmp_path / "saved"
    target.mkdir()
    fd = os.open(target, os.O_RDONLY)  # a save in progress elsewhere holds the directory
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError, match="another save into .* is in progress"):
            fitted.save_pretrained(target)
    finally:
        os.close(fd)
    assert os.listdir(target) == []  # the refused save wrote nothing
    for round_ in range(3):  # two threads at once: each save ends complete or is refused clearly
        errors = []

        def save():
            try:
                fitted.save_pretrained(tmp_path / f"race-{round_}")
            except BlockingIOError as error:
                errors.append(error)

        threads = [threading.Thread(target=save) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(errors) <= 1
        Scorer.from_pretrained(tmp_path / f"race-{round_}", device="cpu")  # complete, verified


@pytest.mark.parametrize("drop", ["one", "all"])
def test_weights_with_missing_or_unexpected_tensors_are_refused_even_without_verify(fitted, tmp_path, drop):
    """Before, with verify=False, a weights file with missing tensors (even an empty one) loaded as a
    randomly initialised encoder."""
    from safetensors.torch import load_file, save_file

    fitted.save_pretrained(tmp_path / "s")
    weights = tmp_path / "s" / "encoder" / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    kept = {k: v for k, v in tensors.items() if k != name} if drop == "one" else {}
    save_file({**kept, "extra.weight": torch.zeros(2)}, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing tensors") as error:
        Scorer.from_pretrained(tmp_path / "s", device="cpu", verify=False)
    assert name in str(error.value) and "unexpected tensors ['extra.weight']" in str(error.value)


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_saved_files_follow_the_umask(fitted, tmp_path, umask):
    """Before, the weights and centering files were 0600 whatever the umask."""
    previous = os.umask(umask)
    try:
        fitted.save_pretrained(tmp_path / "s")
    finally:
        os.umask(previous)
    modes = {p.relative_to(tmp_path / "s").as_posix(): p.stat().st_mode & 0o777
             for p in (tmp_path / "s").rglob("*") if p.is_file()}
    assert "encoder/model.safetensors" in modes and set(modes.values()) == {0o666 & ~umask}, modes
