"""Typed settings: a mapping of options checked against annotations (of a
dataclass, a constructor or a function), unknown keys and wrong types refused
in one paragraph that names the key and what is valid. One mechanism for every
section of a run's settings (rope_lm/runs/config.py) and every script's."""

from dataclasses import fields
import inspect
import math
import types
import typing

from rope_lm.core.errors import ConfigError


def _describe(annotation) -> str:
    if annotation is inspect.Parameter.empty or annotation is typing.Any:
        return "any value"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (list, tuple):
        (item, *_) = typing.get_args(annotation) or (typing.Any,)
        if item is typing.Any:
            return "a list"
        return f"a list of {_describe(item).removeprefix('an ').removeprefix('a ')}s"
    return {
        int: "an integer",
        float: "a number",
        bool: "true or false",
        str: "a string",
        dict: "a mapping",
        type(None): "null",
    }.get(annotation, getattr(annotation, "__name__", str(annotation)))


class _Mismatch(Exception):
    pass


def _coerce(value, annotation):
    """value as the annotation's type, or _Mismatch; ints stand for floats,
    never the other way round, and booleans are never numbers."""
    if annotation is inspect.Parameter.empty or annotation is typing.Any:
        return value
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            try:
                return _coerce(value, option)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is typing.Literal:
        if value in typing.get_args(annotation):
            return value
        raise _Mismatch
    if origin in (list, tuple) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        (item, *_) = typing.get_args(annotation) or (typing.Any,)
        return [_coerce(v, item) for v in value]
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise _Mismatch
        return value
    if annotation is type(None):
        if value is None:
            return None
        raise _Mismatch
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():  # 1e6 in YAML is a float
            return int(value)
        raise _Mismatch
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if annotation is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if isinstance(annotation, type):
        if isinstance(value, annotation):
            return value
        raise _Mismatch
    return value  # an annotation this checker does not model (e.g. a Protocol): the consumer checks it


def typed(options: dict, annotations: dict, prefix: str, what: str, free: set = frozenset()) -> dict:
    """options checked against {key: annotation}: unknown keys and values of the
    wrong type are refused, naming the key, the value and what is valid."""
    if not isinstance(options, dict):
        raise ConfigError(f"`{prefix.rstrip('.')}` must be a mapping of settings, not {options!r}.")
    unknown = sorted(set(options) - set(annotations) - set(free))
    if unknown:
        raise ConfigError(
            f"Unknown {what} setting(s) {', '.join(prefix + k for k in unknown)}; valid `{prefix}*` settings are "
            f"{', '.join(sorted(set(annotations) | set(free)))}."
        )
    out = {}
    for key, value in options.items():
        if key in free:
            out[key] = value
            continue
        try:
            out[key] = _coerce(value, annotations[key])
        except _Mismatch:
            shown = f"{value!r} ({type(value).__name__})" if not isinstance(value, str) else repr(value)
            raise ConfigError(
                f"{prefix}{key}={shown} has the wrong type: it must be {_describe(annotations[key])}."
            ) from None
        if not _finite(out[key]):
            # No rope-lm or Lightning setting means anything by nan or inf: a learning rate, a clip
            # value or a ratio that is not finite only fails later, inside the optimizer or at step 1.
            raise ConfigError(
                f"{prefix}{key}={value!r} is not finite: it must be {_describe(annotations[key])}, "
                f"and nan or inf is never a valid setting."
            )
    return out


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


def dataclass_annotations(cls, exclude=()) -> dict:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls) if f.name not in exclude}


def signature_annotations(fn, skip: int = 0) -> tuple[dict, bool]:
    """{parameter: annotation} of a callable (after `skip` positional ones),
    and whether it also takes **kwargs."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # string annotations that do not resolve: fall back to the raw ones
        hints = {}
    named = {p.name: hints.get(p.name, p.annotation) for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return named, any(p.kind == p.VAR_KEYWORD for p in params)


def typed_dataclass(cls, options: dict, prefix: str, what: str, exclude=()):
    obj = cls(**typed(options, dataclass_annotations(cls, exclude), prefix, what))
    if hasattr(obj, "validate"):
        obj.validate()
    return obj


def _component_annotations(cls, skip: int) -> dict:
    """Constructor settings of a scheme or method, following **common up the MRO."""
    out = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        named, more = signature_annotations(init, skip=skip)
        for k, v in named.items():
            out.setdefault(k, v)
        if not more:
            break
    return out


def typed_component(registry, options: dict, group: str) -> dict:
    """pos.* or scaling.*: the name must be registered, and every other key a
    typed constructor argument of that class."""
    if not isinstance(options, dict):
        raise ConfigError(f"`{group}` must be a mapping of settings with a name, not {options!r}.")
    cls = registry.get(options.get("name"))
    skip = 2 if group == "pos" else 1  # self (and dims for a scheme)
    annotations = _component_annotations(cls, skip)
    settings = {k: v for k, v in options.items() if k != "name"}
    unknown = sorted(set(settings) - set(annotations))
    if unknown:
        name = options["name"]
        valid = ", ".join(f"{group}.{k}" for k in sorted(annotations))
        others = [_component_annotations(registry.get(n), skip) for n in registry.names() if n != name]
        # Keys that another scheme takes: the name was changed alone (pos.name=alibi), keeping the
        # settings of the scheme it replaced, which `pos=alibi` would have swapped for its own.
        leftover = all(any(k in o for o in others) for k in unknown)
        raise ConfigError(
            f"Unknown {group} {name!r} setting(s) {', '.join(group + '.' + k for k in unknown)}; "
            + (f"{name!r} takes {valid}." if valid else f"{name!r} takes no settings besides its name.")
            + (
                f" Choose a {'scheme' if group == 'pos' else 'method'} with {group}={name}, which loads "
                f"conf/{group}/{name}.yaml with its own settings; {group}.name={name} alone keeps the settings of "
                f"the one it replaces."
                if leftover
                else ""
            )
        )
    checked = typed(settings, annotations, f"{group}.", f"{group} {options.get('name')!r}")
    return {"name": options["name"], **checked}
