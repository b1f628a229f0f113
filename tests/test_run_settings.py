"""Settings added to the config files since a run was made: at the value that
does what the run did, they are no difference (an older study continues, its
seed replicas group); at any other value they are."""

from rope_lm.runs.run_settings import settings_differences, settings_key

OLD = {"pos": {"name": "rope", "base": 10000.0}, "scaling": {"name": "window", "window": 64}}
NOW = {
    "pos": {"name": "rope", "base": 10000.0, "p_rope": 1.0},
    "scaling": {"name": "window", "window": 64, "sinks": 0, "sink_positions": "cache"},
}


def test_options_added_at_their_default_are_no_difference():
    assert settings_differences(OLD, NOW) == []
    assert settings_differences(NOW, OLD) == []
    assert settings_key(OLD) == settings_key(NOW)


def test_the_same_options_at_other_values_are():
    changed = {**NOW, "pos": {**NOW["pos"], "p_rope": 0.5}, "scaling": {**NOW["scaling"], "sinks": 4}}
    assert settings_differences(OLD, changed) == [("pos.p_rope", None, 0.5), ("scaling.sinks", None, 4)]
    assert settings_key(OLD) != settings_key(changed)
    # A key of the same name elsewhere is not an added option.
    assert settings_differences({"model": {}}, {"model": {"sinks": 0}}) == [("model.sinks", None, 0)]
