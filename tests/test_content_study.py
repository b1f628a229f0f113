"""The presets of the study of positions that read the content (issue 52 req 5): content_schemes (each
scheme x 3 seeds on the PG-19 sample, pe_headline's protocol) and content_tasks (CoPE's tasks beside copy).
Every arm of each sweep is composed and resolved as its program resolves it before any work (every key,
the scheme asked whether it serves the longest evaluation or test sequence), and the runs' folder names
are told apart, p-RoPE from RoPE included (both are pos.name rope)."""

import os

from omegaconf import OmegaConf

from tests.conftest import ROOT
from tests.test_compare import compose

SCHEMES = ["rope", "alibi", "nope", "fox", "stick_breaking", "cope", "path", "p_rope", "pope"]
TASKS = ["copy", "counting", "selective_copy", "flip_flop"]


def compose_with_hydra(config_name, overrides):
    """The composed config, its sweep's folder name for this job (resolved with the job's runtime choices, as
    Hydra names it) and the sweep's parameters."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
        subdir = cfg.hydra.sweep.subdir
        params = OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.params else {}
        OmegaConf.set_struct(cfg, False)
        del cfg["hydra"]
        return OmegaConf.to_container(cfg, resolve=True), subdir, params


def test_content_schemes_sweeps_every_scheme_three_seeds_on_the_headline_protocol():
    from rope_lm.runs.config import resolve_run

    cfg, sweep = compose(["+experiment=content_schemes"])
    assert sweep["pos"].split(",") == SCHEMES and sweep["seed"].split(",") == ["0", "1", "2"]
    assert sweep["experiment/pe_scheme@_global_"] == "rope"  # one value: the swept `pos` picks the scheme
    # Seeds vary slowest (Hydra's product runs the first list slowest): every scheme has seed 0 before any
    # has a second run.
    assert list(sweep).index("seed") < list(sweep).index("pos")
    headline, _ = compose(["+experiment=pe_headline"])
    for key in ("data", "eval", "trainer", "model", "optim"):
        assert cfg[key] == headline[key], key  # pe_headline's protocol and budget, unchanged
    assert cfg["eval"]["controls"] == ["window"] and cfg["eval"]["protocol"] == "documents"
    assert cfg["data"]["test_fraction"] == 0.3 and cfg["trainer"]["max_steps"] == 6000
    assert cfg["existing"] == "continue"
    names = set()
    for scheme in SCHEMES:
        overrides = ["+experiment=content_schemes", f"pos={scheme}", "seed=2"]
        arm, subdir, _ = compose_with_hydra("config", overrides)
        run = resolve_run(arm)  # every key and the scheme's fit at 16 x L, as train.py checks before work
        assert run.data.seq_len == 64 and max(run.lengths) == 16 * 64 and run.controls == ["window"]
        assert arm["pos"]["name"] == ("rope" if scheme == "p_rope" else scheme)
        assert arm["pos"].get("p_rope", 1.0) == (0.75 if scheme == "p_rope" else 1.0)
        names.add(subdir)
        assert subdir == f"{scheme}_seed2_none_L64"
    assert len(names) == len(SCHEMES)


def test_train_long_bound_shares_the_study_split():
    from rope_lm.runs.config import resolve_run

    cfg, _ = compose(["+experiment=content_schemes"])
    long, _ = compose(["+experiment=train_long_pg19"])
    for key in ("path", "test_fraction", "valid_fraction", "name"):
        assert long["data"][key] == cfg["data"][key], key  # the same books, so the same tokenizer cuts them
    assert long["eval"]["protocol"] == cfg["eval"]["protocol"]
    assert long["eval"]["document_tokens"] == cfg["eval"]["document_tokens"]
    assert resolve_run(long).data.seq_len == 16 * cfg["data"]["seq_len"]


def test_train_long_bound_continues_each_headline_seed_at_1024_with_as_many_windows_a_step():
    from rope_lm.runs.config import resolve_run

    headline, _ = compose(["+experiment=pe_headline"])
    arm, subdir, sweep = compose_with_hydra("config", ["+experiment=train_long_bound", "seed=1"])
    assert sweep["seed"] == "0,1,2" and subdir == "rope_L1024_from_L64_seed1"
    # The headline's sweep over five schemes is not inherited: its ALiBi, NoPE, ... runs would each try to continue
    # the RoPE checkpoint into the same folder (the multirun's other four jobs refused).
    assert sweep["experiment/pe_scheme@_global_"] == "rope"
    assert arm["init_from"] == "outputs/results/pe_headline_pg19_6000/rope_seed1_none_L64"  # the same seed's base
    run = resolve_run(arm)
    assert run.data.seq_len == 16 * headline["data"]["seq_len"]
    assert run.data.batch_size == headline["data"]["batch_size"] == 16  # as many windows a step
    for key in ("path", "test_fraction", "valid_fraction", "name"):
        assert arm["data"][key] == headline["data"][key], key
    assert run.lengths == [64, 80, 96, 128, 256, 512, 1024]  # the headline's lengths
    assert run.controls == ["window"] and run.control_window == 64  # itself cut to the headline's L
    assert arm["eval"]["protocol"] == "documents" and arm["eval"]["token_budget"] == headline["eval"]["token_budget"]


def test_a_study_s_other_seeds_get_folders_of_their_own():
    """The default sweep folder names carry the seed past the config's default (train.py 1337, task.py 0), so
    seed=1 of a study run in its own sitting into the same folder does not meet seed 0's runs; the folders of
    runs made at the default keep their names."""
    import rope_lm.cli  # noqa: F401  (registers ${seed_tag:}, as every entry point does)

    for config, default in (("config", 1337), ("task_run", 0)):
        _, plain, _ = compose_with_hydra(config, [f"seed={default}", "hydra.job.num=3"])
        _, other, _ = compose_with_hydra(config, ["seed=2", "hydra.job.num=3"])
        assert other == plain + "_seed2" and "seed" not in plain
    _, task, _ = compose_with_hydra("task_run", ["+experiment=length_generalization", "seed=1", "hydra.job.num=0"])
    assert task.endswith("_seed1")


def test_content_tasks_sweeps_cope_rope_fox_nope_on_copes_tasks_and_copy():
    from rope_lm.probes.task_run import build_task, resolve_task_run

    _, _, sweep = compose_with_hydra("task_run", ["+experiment=content_tasks"])
    assert sweep["task"].split(",") == TASKS
    assert sweep["pos"].split(",") == ["cope", "rope", "fox", "nope"]
    assert sweep["seed"].split(",") == ["0", "1", "2"]
    names = set()
    for task in TASKS:
        for scheme in sweep["pos"].split(","):
            overrides = ["+experiment=content_tasks", f"task={task}", f"pos={scheme}", "seed=1"]
            arm, subdir, _ = compose_with_hydra("task_run", overrides)
            run = resolve_task_run(arm)  # the scheme asked whether it serves the longest test sequence
            assert run.existing == "continue" and run.train.steps == 4000
            # in-distribution sizes 1..16, tested to 2 x 16: longer programs, prompts and flip-flop sequences
            assert (run.sizes.train_min, run.sizes.train_max, run.sizes.test_max) == (1, 16, 32)
            assert build_task(run.task).max_tokens(run.sizes.test_max) > build_task(run.task).max_tokens(16)
            names.add(subdir)
    assert len(names) == len(TASKS) * 4 and "counting_cope_seed1" in names


def test_headline_budget_is_the_headline_at_600_and_2000_steps_with_seeds_and_controls():
    """The budget curve on the headline's protocol: only trainer.max_steps differs from pe_headline, and each
    budget x scheme x seed has a folder of its own."""
    from rope_lm.runs.config import resolve_run

    cfg, sweep = compose(["+experiment=headline_budget"])
    headline, _ = compose(["+experiment=pe_headline"])
    assert sweep == {"seed": "0,1,2", "experiment/pe_scheme@_global_": "rope,alibi", "trainer.max_steps": "600,2000"}
    for key in ("data", "eval", "model", "optim"):
        assert cfg[key] == headline[key], key
    assert {k: v for k, v in cfg["trainer"].items() if k != "max_steps"} == {
        k: v for k, v in headline["trainer"].items() if k != "max_steps"
    }
    names = set()
    for scheme in ("rope", "alibi"):
        for steps in (600, 2000):
            overrides = ["+experiment=headline_budget", f"experiment/pe_scheme@_global_={scheme}", "seed=1"]
            arm, subdir, _ = compose_with_hydra("config", overrides + [f"trainer.max_steps={steps}"])
            run = resolve_run(arm)
            assert run.trainer.max_steps == steps and run.controls == ["window"] and max(run.lengths) == 16 * 64
            assert subdir == f"{scheme}_seed1_steps{steps}_L64"
            names.add(subdir)
    assert len(names) == 4
