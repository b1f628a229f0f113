"""scripts/generate.py given what a hostile first week gave it: a binary
file=, an empty stop string spelled two ways, a length no machine holds. Each
is one paragraph with exit status 2, before the model writes anything."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

RUN = os.path.join(ROOT, "tests", "fixtures", "run_before_house")


def generate(tmp_path, *args):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "generate.py"), f"ckpt={RUN}", "device=cpu", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def test_a_binary_file_is_refused_as_not_text(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    rc, text = generate(tmp_path, f"file={binary}", "max_new_tokens=2")
    assert rc == 2 and "is not UTF-8 text" in text and "Traceback" not in text, text


@pytest.mark.parametrize("stop", ["stop=''", "stop=['']"])
def test_an_empty_stop_string_is_refused_however_it_is_spelled(tmp_path, stop):
    rc, text = generate(tmp_path, "prompt='ab'", "max_new_tokens=2", stop)
    assert rc == 2 and "Stop strings must be non-empty text" in text and "stop=[]" in text, text


def test_no_stop_strings_is_an_empty_list(tmp_path):
    rc, text = generate(tmp_path, "prompt='ab'", "max_new_tokens=2", "stop=[]")
    assert rc == 0, text


def test_a_generation_longer_than_the_machine_holds_is_refused_with_its_figure(tmp_path):
    rc, text = generate(tmp_path, "prompt='def f():'", "max_new_tokens=100000000000")
    assert rc == 2 and "GiB" in text and "max_new_tokens=100000000000" in text and "Traceback" not in text, text
