"""data.* settings, checked, split into what the loaders read (DataConfig)
and what the corpus source reads (SourceConfig)."""

from dataclasses import fields

from rope_lm.core.typed import dataclass_annotations, typed, typed_dataclass
from rope_lm.data.corpus import SourceConfig
from rope_lm.data.token_cache import DataConfig

# data.*: the loader (DataConfig) and source (SourceConfig) settings under one prefix.
DATA_ANNOTATIONS = {**dataclass_annotations(DataConfig), **dataclass_annotations(SourceConfig)}


def split_data(options: dict) -> tuple[DataConfig, SourceConfig]:
    """data.* settings, checked, as loader (DataConfig) and source (SourceConfig) settings."""
    typed(options, DATA_ANNOTATIONS, "data.", "data")
    source_keys = {f.name for f in fields(SourceConfig)}
    return (
        typed_dataclass(DataConfig, {k: v for k, v in options.items() if k not in source_keys}, "data.", "data"),
        typed_dataclass(SourceConfig, {k: v for k, v in options.items() if k in source_keys}, "data.", "data"),
    )
