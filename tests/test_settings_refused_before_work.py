"""Settings that used to get past the check and fail later (at AdamW's first
step, or as another setting's name): each is refused by resolve_run, before
data or a model is built, in one paragraph naming the setting and what is valid."""

import copy

import pytest

from rope_lm.core.errors import ConfigError
from rope_lm.runs.config import resolve_run
from rope_lm.train.sharding import check_world


def with_(config, section, **values):
    config = copy.deepcopy(config)
    config[section].update(values)
    return config


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("beta2", 1.5, r"optim\.beta2=1\.5 must be within \[0, 1\)"),
        ("beta1", -0.1, r"optim\.beta1=-0\.1 must be within \[0, 1\)"),
        ("beta2", 1.0, r"optim\.beta2=1\.0 must be within \[0, 1\)"),
        ("eps", -1e-8, r"optim\.eps=-1e-08 .* must be 0 or more"),
        ("weight_decay", -0.1, r"optim\.weight_decay=-0\.1 must be 0 or more"),
    ],
)
def test_an_optimizer_setting_adamw_would_refuse_at_its_first_step_is_refused_first(tiny_config, key, value, match):
    with pytest.raises(ConfigError, match=match):
        resolve_run(with_(tiny_config, "optim", **{key: value}))


@pytest.mark.parametrize(
    "layout, where",
    [
        ({"pattern": ["rope", "ropee"]}, r"model\.layout\.pattern\[1\]\)"),
        ({"layers": [{"pos": {"name": "alibbi"}}, "rope"]}, r"model\.layout\.layers\[0\]\.pos\.name"),
    ],
)
def test_an_unknown_scheme_in_a_layout_is_named_by_its_entry_not_as_pos_name(tiny_config, layout, where):
    with pytest.raises(ConfigError, match=rf"Unknown positional scheme .* in the layout \({where}.*Valid names") as e:
        resolve_run(with_(tiny_config, "model", layout=layout))
    assert "`pos.name`" not in str(e.value)


def test_sharding_over_one_device_names_the_setting_a_resumed_run_can_change():
    """A resumed run's settings come from its run.yaml, so `drop trainer=fsdp` cannot be done there."""
    with pytest.raises(ConfigError, match=r"trainer\.sharded=false") as e:
        check_world(1, 1)
    assert "a resumed one" in str(e.value)
