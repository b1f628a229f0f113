"""Checkpoints and run folders written by an earlier layout of the package
still open: tests/fixtures/run_before_house/ was written by train.py at commit
8a62d17, before rope_lm/ moved into its subpackages, with the logits it gave
recorded beside it. A checkpoint holds plain values only (no pickled rope_lm
class), so a module that moves cannot break one; this test fails if that ever
stops being true."""

import json
import os
import shutil
import zipfile

import torch

from tests.conftest import ROOT

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "run_before_house")


def expected():
    with open(os.path.join(FIXTURE, "expected.json"), encoding="utf-8") as f:
        return json.load(f)


def logits_of(source):
    from rope_lm.runs.trained import open_model

    t = open_model(source, device="cpu")
    ids = torch.tensor([expected()["ids"]])
    with torch.no_grad():
        out = t.model(ids)
    return t, (out[0] if isinstance(out, tuple) else out)[0]


def test_an_old_run_folder_opens_with_the_logits_it_gave(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(FIXTURE, folder)
    t, logits = logits_of(str(folder))
    want = expected()
    assert t.train_len == want["train_len"]
    for row, values in zip((0, 17, 39), want["logits_rows_0_17_39"]):
        assert torch.allclose(logits[row, :12], torch.tensor(values), atol=1e-4), row
    assert torch.allclose(torch.logsumexp(logits, -1), torch.tensor(want["logsumexp"]), atol=1e-4)


def test_an_old_checkpoint_file_opens_by_its_path():
    _, logits = logits_of(os.path.join(FIXTURE, "checkpoints", "last.ckpt"))
    assert torch.allclose(torch.logsumexp(logits, -1), torch.tensor(expected()["logsumexp"]), atol=1e-4)


def test_a_checkpoint_pickles_no_rope_lm_class():
    """What makes a move of modules safe for saved runs: unpickling names no module of ours."""
    with zipfile.ZipFile(os.path.join(FIXTURE, "checkpoints", "last.ckpt")) as z:
        pickled = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert b"rope_lm." not in pickled.replace(b"rope_lm_", b"")


def test_each_weight_is_saved_once_and_an_old_doubled_checkpoint_still_loads():
    """A checkpoint held every weight twice (`model.*` and `_forward.*`, the forward registered as a second
    child); now once. An old one still resumes: LitLM.on_load_checkpoint (which Lightning calls before it
    loads the weights, strictly) drops the second copy."""
    from rope_lm.train.lit import LitLM

    saved = torch.load(os.path.join(FIXTURE, "checkpoints", "last.ckpt"), map_location="cpu", weights_only=False)
    doubled = [k for k in saved["state_dict"] if k.startswith("_forward.")]
    assert doubled and len(doubled) == sum(k.startswith("model.") for k in saved["state_dict"])
    for compile in (False, True):
        lit = LitLM(**{**saved["hyper_parameters"], "compile": compile})
        assert all(k.startswith("model.") for k in lit.state_dict())
        assert sum(p.numel() for p in lit.parameters()) == sum(p.numel() for p in lit.model.parameters())
    lit.on_load_checkpoint(saved)
    assert not any(k.startswith("_forward.") for k in saved["state_dict"])
    lit.load_state_dict(saved["state_dict"])  # strict, as Lightning loads it on a resume
    torch.testing.assert_close(lit.model.wte.weight, saved["state_dict"]["model.wte.weight"])
