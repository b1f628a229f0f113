"""Per-layer layouts (``model.layout``): each layer its own positional scheme,
scheme settings and attention span, as the models of 2025 mix them (SmolLM3
drops RoPE in every fourth layer, Gemma 3 alternates local and global layers
with different bases, Command A runs three sliding RoPE layers then one
global NoPE layer).

Written compactly as a pattern repeated over the layers (and cut where the
layers end, as Gemma 3 1B repeats its 6-layer rhythm over 26 layers), or in
full:

    model.layout: {pattern: [rope, rope, rope, nope]}                  # every 4th layer NoPE
    model.layout: {pattern: [{window: 64}, {window: 64}, {pos: {name: nope}}]}
    model.layout: {layers: [...one entry per layer...]}

An entry is a scheme name or a mapping with any of

* ``pos``: scheme settings; without a ``name`` (or with the run's ``pos.name``)
  they override the run's ``pos`` settings, with another name they are that
  scheme's own settings (its defaults elsewhere);
* ``window``: a sliding window of W keys (null: full attention);
* ``sinks``: with a window, the first k tokens stay visible to every query
  (StreamingLLM's attention sinks; 0, the default, none);
* ``softmax``: this layer's softmax options (rope_lm/model/softmax_options.py),
  merged key by key over ``model.softmax`` (a key set to null turns that
  option off here), e.g. Llama 4's temperature on its NoPE layers only;
* ``scaling``: false keeps the run's method off this layer (true, the
  default, lets it act wherever it applies).

A layer's scheme acts at that layer: rotations and biases in its attention,
and an absolute scheme's embedding (learned, sinusoidal, multiplicative,
recurrent) is added to that layer's input. Without a layout every layer uses
``pos``, full attention and the method, and the embedding is added once at
the input: the model of before layouts, bit for bit.
"""

from dataclasses import dataclass

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES


class _Unresolved:
    def __repr__(self):
        return "UNRESOLVED"


# The default of a `layers` argument (TransformerLM, build_model, check_fit, LitLM, ...): the caller has not
# resolved the model's layer specs, so the callee resolves them itself, once, from model.layout. A run
# resolves them in rope_lm.runs.config.resolve_run and hands them down; a checkpoint, an import or a test
# that builds a model from its settings alone leaves the argument out.
UNRESOLVED = _Unresolved()


@dataclass(frozen=True)
class LayerSpec:
    pos: dict  # complete scheme settings, name included
    window: int | None = None
    scaled: bool = True
    sinks: int = 0  # tokens at the start kept visible to the window
    softmax: dict | None = None  # overrides of model.softmax for this layer


def _entry(entry, pos: dict, where: str) -> LayerSpec:
    string_entry = isinstance(entry, str)
    if isinstance(entry, str):
        entry = {"pos": {"name": entry}}
    if entry is None:
        entry = {}
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}={entry!r} must be a scheme name or a mapping with pos, window and/or scaling.")
    unknown = set(entry) - {"pos", "window", "scaling", "sinks", "softmax"}
    if unknown:
        raise ConfigError(
            f"{where} has unknown key(s) {', '.join(sorted(unknown))}; an entry takes pos (scheme "
            f"settings), window (a sliding window of W keys, or null), sinks (tokens kept visible "
            f"to the window), softmax (softmax options) and scaling (true/false)."
        )
    settings = entry.get("pos") or {}
    if not isinstance(settings, dict):
        raise ConfigError(f"{where}.pos={settings!r} must be a mapping of scheme settings (e.g. {{name: nope}}).")
    name = settings.get("name", pos.get("name"))
    if "name" in settings and name not in SCHEMES.names():
        shown = where if string_entry else f"{where}.pos.name"
        raise ConfigError(
            f"Unknown positional scheme {name!r} in the layout ({shown}). Valid names are: "
            f"{', '.join(SCHEMES.names())}."
        )
    full = {**pos, **settings} if name == pos.get("name") else {**settings, "name": name}
    window = entry.get("window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(f"{where}.window={window!r} must be a positive number of keys, or null for full attention.")
    scaled = entry.get("scaling", True)
    if not isinstance(scaled, bool):
        raise ConfigError(f"{where}.scaling={scaled!r} must be true (the run's method may act here) or false.")
    sinks = entry.get("sinks", 0)
    if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
        raise ConfigError(f"{where}.sinks={sinks!r} must be a number of tokens >= 0.")
    if sinks and window is None:
        raise ConfigError(
            f"{where}.sinks={sinks} keeps the first tokens visible to a sliding window, and this "
            f"layer has none; set {where}.window too, or drop sinks."
        )
    softmax = entry.get("softmax")
    if softmax is not None and not isinstance(softmax, dict):
        raise ConfigError(
            f"{where}.softmax={softmax!r} must be a mapping of softmax options (temperature, ssmax, "
            f"sink_logits), or null."
        )
    return LayerSpec(pos=full, window=window, scaled=scaled, sinks=sinks, softmax=softmax)


def layer_specs(layout: dict | None, pos: dict, n_layer: int) -> list[LayerSpec] | None:
    """One LayerSpec per layer, or None where there is no layout."""
    if layout is None:
        return None
    if not isinstance(layout, dict):
        raise ConfigError(f"model.layout={layout!r} must be a mapping with `pattern` or `layers`, or null.")
    unknown = set(layout) - {"pattern", "layers", "name"}
    if unknown:
        raise ConfigError(
            f"model.layout has unknown key(s) {', '.join(sorted(unknown))}; it takes `pattern` "
            f"(repeated over the layers) or `layers` (one entry per layer), and an optional name."
        )
    if layout.get("pattern") is None and layout.get("layers") is None:
        return None
    if layout.get("pattern") is not None and layout.get("layers") is not None:
        raise ConfigError(
            "model.layout sets both `pattern` and `layers`; give one: a pattern repeated over the "
            "layers, or one entry per layer."
        )
    key = "pattern" if layout.get("pattern") is not None else "layers"
    entries = layout[key]
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ConfigError(f"model.layout.{key}={entries!r} must be a non-empty list of entries.")
    if key == "layers" and len(entries) != n_layer:
        raise ConfigError(
            f"model.layout.layers has {len(entries)} entries for model.n_layer={n_layer} layers; give "
            f"one per layer, or a `pattern` to repeat."
        )
    specs = [_entry(e, pos, f"model.layout.{key}[{i}]") for i, e in enumerate(entries)]
    return [specs[i % len(specs)] for i in range(n_layer)]


def scheme_label(pos: dict, model: dict | None) -> str:
    """What results.json calls the model's scheme: `pos` alone, then
    `+<layout name>` under a layout and `+<option>` for each model.softmax
    option set (e.g. rope+nope_every_4, rope+ssmax), so compared runs and run
    folders tell these models from their plain scheme."""
    model = model or {}
    label = pos["name"]
    layout = model.get("layout")
    if layout and (layout.get("pattern") is not None or layout.get("layers") is not None):
        label += f"+{layout.get('name') or 'layout'}"
    softmax = model.get("softmax") or {}
    return label + "".join(f"+{key}" for key in ("temperature", "ssmax", "sink_logits") if softmax.get(key) is not None)


def describe(specs: list[LayerSpec] | None) -> str:
    """A short label, e.g. 'rope x3 + nope' or 'rope(w=64) / nope'."""
    if specs is None:
        return ""
    words = [
        s.pos["name"] + (f"(w={s.window}" + (f"+{s.sinks}" if s.sinks else "") + ")" if s.window else "") for s in specs
    ]
    return " / ".join(words)
