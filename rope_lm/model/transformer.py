"""A decoder-only, pre-norm, causal transformer that knows positional schemes
only through the hooks of rope_lm.positional.base (docs/architecture.md)."""

from dataclasses import asdict, dataclass, fields, replace
import json

import torch
from torch import nn
from torch.nn import functional as F

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import KERNELS, attend
from rope_lm.model import experts as moe
from rope_lm.model import softmax_options
from rope_lm.model.kv_cache import KVCache, cached_attention
from rope_lm.model.layout import UNRESOLVED, LayerSpec, layer_specs
from rope_lm.model.norms import NORM_KINDS, build_norm
from rope_lm.model.recompute import run_block
from rope_lm.positional import Dims, PosContext, build_scheme
from rope_lm.scaling import build_scaling


@dataclass
class ModelConfig:
    vocab_size: int
    train_len: int
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    tie_embeddings: bool = True
    bias: bool = False  # biases of the output projection and the MLP
    attention: str = "auto"  # one of attention.KERNELS
    tuned_len: int | None = None  # set by a fine-tune (init_from): see PosContext.tuned_len
    # Llama-family options; the defaults build the original GPT-style model.
    mlp: str = "gelu"  # gelu: fc -> GELU -> proj; swiglu: proj(SiLU(gate x) * fc x)
    mlp_hidden: int | None = None  # hidden width; None: int(mlp_ratio * d_model)
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); None: n_head, 1: multi-query
    head_dim: int | None = None  # None: d_model / n_head
    norm_eps: float | None = None  # RMSNorm epsilon; None: torch's default (finfo(dtype).eps)
    qkv_bias: bool | None = None  # bias on the q/k/v projection (Qwen2); None: same as `bias`
    layout: dict | None = None  # per-layer schemes and windows (rope_lm/model/layout.py); None: `pos` everywhere
    activation_checkpointing: bool = False  # recompute each block in backward (rope_lm/model/recompute.py)
    # Options of the 2025 families (rope_lm/hf maps them); each default leaves the model above unchanged.
    norm: str = "rms"  # one of norms.NORM_KINDS: rms, rms_offset (Gemma's 1 + w), layer (Cohere's, no bias)
    qk_norm: bool = False  # a `norm` over each head's query and key before rotation (Qwen3, Gemma 3)
    post_norms: bool = False  # a `norm` on each sublayer's output before the residual add (Gemma 2/3)
    parallel: bool = False  # attention and MLP read the same normed input and add together (Cohere)
    embed_scale: float | None = None  # token embeddings times this (Gemma: sqrt(d_model)); None: 1
    attn_scale: float | None = None  # softmax scale of q.k; None: 1 / sqrt(head_size)
    logit_scale: float | None = None  # logits times this (Cohere), folded into the final hidden states
    experts: dict | None = None  # mlp=moe: {count, top_k, limit, alpha}, gpt-oss's experts (rope_lm/model/experts.py)
    softmax: dict | None = None  # temperature, SSMax, sink logits (rope_lm/model/softmax_options.py); None: plain

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_size(self) -> int:
        return self.d_model // self.n_head if self.head_dim is None else self.head_dim

    @property
    def hidden_size(self) -> int:
        return int(self.mlp_ratio * self.d_model) if self.mlp_hidden is None else self.mlp_hidden

    def validate(self):
        self.resolve({})

    def resolve(self, pos: dict) -> list[LayerSpec] | None:
        """Every setting checked, and the layer specs of model.layout under the
        run's scheme settings `pos` (None without a layout) made: the one place
        a model's settings are resolved. Its answer is handed to what builds or
        checks the model (TransformerLM, check_fit, ...) as `layers`."""
        for key in ("vocab_size", "train_len", "n_layer", "n_head", "d_model"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"model setting {key}={getattr(self, key)} must be a positive integer.")
        if self.mlp not in MLP_KINDS:
            raise ConfigError(f"model.mlp={self.mlp!r} is not an MLP kind; use one of {', '.join(MLP_KINDS)}.")
        for key in ("n_kv_head", "head_dim", "mlp_hidden"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ConfigError(f"model.{key}={value!r} must be a positive integer or null.")
        if self.n_head % self.kv_heads:
            raise ConfigError(
                f"model.n_kv_head={self.n_kv_head} must divide model.n_head={self.n_head}: each key/value head "
                f"serves a whole group of query heads."
            )
        if self.norm_eps is not None and not (isinstance(self.norm_eps, (int, float)) and self.norm_eps > 0):
            raise ConfigError(f"model.norm_eps={self.norm_eps!r} must be a positive number or null.")
        if self.head_dim is None and self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_head={self.n_head}; "
                f"the head dimension must be a whole number (e.g. d_model={self.n_head * max(1, self.d_model // self.n_head)})."
            )
        moe.check(self.experts, self.mlp)
        if self.norm not in NORM_KINDS:
            raise ConfigError(f"model.norm={self.norm!r} is not a norm kind; use one of {', '.join(NORM_KINDS)}.")
        for key in ("qk_norm", "post_norms", "parallel"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"model.{key}={getattr(self, key)!r} must be true or false.")
        if self.parallel and self.post_norms:
            raise ConfigError(
                "model.parallel=true with model.post_norms=true: a parallel block adds both sublayers "
                "at once and has no place for per-sublayer output norms; set one of them false."
            )
        for key in ("embed_scale", "attn_scale", "logit_scale"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ConfigError(f"model.{key}={value!r} must be a positive number or null (no scaling).")
        if self.attention not in KERNELS:
            raise ConfigError(f"model.attention={self.attention!r} is not a kernel; use one of {', '.join(KERNELS)}.")
        layers = layer_specs(self.layout, pos, self.n_layer)  # the layout's shape; its schemes are checked when built
        if not isinstance(self.activation_checkpointing, bool):
            raise ConfigError(
                f"model.activation_checkpointing={self.activation_checkpointing!r} must be true or "
                f"false (true recomputes each block's activations in backward)."
            )
        for layer in range(self.n_layer):
            layer_softmax(self, layer, layers)
        if self.mlp_ratio <= 0 or not 0 <= self.dropout < 1:
            raise ConfigError(
                f"model.mlp_ratio={self.mlp_ratio} must be positive and model.dropout={self.dropout} within [0, 1)."
            )
        return layers

    def dims(self) -> Dims:
        return Dims(self.d_model, self.n_head, self.head_size, self.n_layer, self.train_len)


def layer_softmax(cfg: ModelConfig, layer: int, layers: list[LayerSpec] | None) -> softmax_options.SoftmaxOptions:
    """The softmax options of one layer: model.softmax with its layout entry's
    (of the resolved `layers`) over it."""
    own = layers[layer].softmax if layers is not None else None
    where = f"model.softmax with layer {layer}'s layout softmax" if own else "model.softmax"
    return softmax_options.parse(softmax_options.merged(cfg.softmax, own), cfg.train_len, where)


def check_fit(cfg: ModelConfig, pos: dict, scaling: dict | None, length: int, layers=UNRESOLVED) -> None:
    """Refuse a scheme/method pair that does not fit, or a length the scheme or
    method cannot serve, building only the schemes and the method (no weights)."""
    specs = layer_specs(cfg.layout, pos, cfg.n_layer) if layers is UNRESOLVED else layers
    schemes = _layer_schemes(specs, pos, cfg.dims())
    for i, scheme in enumerate(schemes):
        scheme.check_sink_logits(layer_softmax(cfg, i, specs).sink_logits)
    method = build_scaling(scaling)
    active = _active_layers(method, specs, schemes)
    _validate_length(length, method, schemes, active, cfg.train_len)


def layer_schemes(cfg: ModelConfig, pos: dict, layers=UNRESOLVED) -> list:
    """Each layer's positional scheme, built without weights (one instance per distinct setting)."""
    specs = layer_specs(cfg.layout, pos, cfg.n_layer) if layers is UNRESOLVED else layers
    return _layer_schemes(specs, pos, cfg.dims())


def _layer_schemes(specs: list[LayerSpec] | None, pos: dict, dims: Dims) -> list:
    """One scheme per layer; layers with equal settings share the instance."""
    if specs is None:
        scheme = build_scheme(pos, dims)
        return [scheme] * dims.n_layer
    built = {}
    for spec in specs:
        key = json.dumps(spec.pos, sort_keys=True, default=str)
        if key not in built:
            built[key] = build_scheme(spec.pos, dims)
    return [built[json.dumps(spec.pos, sort_keys=True, default=str)] for spec in specs]


def _active_layers(method, specs, schemes) -> list[int]:
    """The layers the method acts on; refuses a method that fits none."""
    if specs is None:
        method.check(schemes[0])
        return list(range(len(schemes)))
    active = [i for i, (spec, scheme) in enumerate(zip(specs, schemes)) if spec.scaled and method.applies(scheme)]
    if not active and method.name != "none":
        names = sorted({s.name for s in schemes})
        raise ConfigError(
            f"Extrapolation method {method.name!r} (setting `scaling`) fits no layer of this layout: its layers use "
            f"{', '.join(names)} (those with scaling: false excluded), and {method.name!r} acts on "
            f"{method.acts_on()}. Choose a method that applies to one of them, or let a layer take it."
        )
    return active


def _validate_length(length, method, schemes, active, train_len):
    plain = build_scaling(None)
    done = set()
    for i, scheme in enumerate(schemes):
        acting = method if i in active else plain
        if (id(scheme), id(acting)) in done:
            continue
        done.add((id(scheme), id(acting)))
        scheme.validate(length, acting)
        acting.validate(length, scheme, train_len)


MLP_KINDS = ("gelu", "swiglu", "geglu", "moe")


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


# The gate's activation of each gated kind (geglu: Gemma's tanh-approximated GELU).
GATES = {"swiglu": F.silu, "geglu": gelu_tanh}


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.hidden_size
        # gate is created first so that the GELU model keeps its parameter
        # (and random-init) order when it has no gate.
        self.act = GATES.get(cfg.mlp)
        self.gate = nn.Linear(cfg.d_model, hidden, bias=cfg.bias) if self.act else None
        self.fc = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        h = F.gelu(self.fc(x)) if self.gate is None else self.act(self.gate(x)) * self.fc(x)
        return self.drop(self.proj(h))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, layers: list[LayerSpec] | None):
        super().__init__()
        self.layer = layer
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_size
        self.kernel = cfg.attention
        # One fused projection, rows ordered [q heads | k heads | v heads].
        qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_head + 2 * self.n_kv_head) * self.head_dim, bias=qkv_bias)
        self.proj = nn.Linear(cfg.n_head * self.head_dim, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)
        self.q_norm = build_norm(cfg.norm, self.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = build_norm(cfg.norm, self.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        # Every kernel divides q.k by sqrt(D); another softmax scale is folded into the queries.
        self.q_factor = None if cfg.attn_scale is None else cfg.attn_scale * self.head_dim**0.5
        self.softmax = layer_softmax(cfg, layer, layers)
        # Created only where asked for, so the state dicts of other models are unchanged.
        self.ssmax = self.sinks = None
        if self.softmax.ssmax_init is not None:
            self.ssmax = nn.Parameter(torch.full((cfg.n_head,), self.softmax.ssmax_init))
        if self.softmax.sink_logits:
            self.sinks = nn.Parameter(torch.zeros(cfg.n_head))

    def split_qkv(self, x):
        """x (B, T, C) -> q (B, H, T, D), k and v (B, Hkv, T, D), unrotated,
        as attention reads them (q/k normed and q scaled where the model says)."""
        B, T, _ = x.shape
        H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.qkv(x).view(B, T, H + 2 * Hkv, D).transpose(1, 2).split((H, Hkv, Hkv), dim=1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.q_factor is not None:
            q = q * self.q_factor
        return q, k, v

    def tune_softmax(self, q, pos, plan, shards=None):
        """q (B, H, t, D), the last t of len(pos) queries (or, with shards,
        this device's share of them), scaled by this layer's temperature and
        SSMax, and the plan with its sink logits."""
        index = None if shards is None else shards.q_index.to(q.device)
        scale = softmax_options.query_scale(self.softmax, self.ssmax, pos.shape[0], q.shape[2], plan, q.device, index)
        if scale is not None:
            q = (q * scale).to(q.dtype)
        if self.sinks is not None:
            plan = replace(plan, sink_logits=self.sinks)
        return q, plan

    def forward(self, x, scheme, pos, plan, ctx, cache=None):
        B, T, _ = x.shape
        q, k, v = self.split_qkv(x)
        q, plan = self.tune_softmax(q, pos, plan, ctx.shards)
        terms = scheme.token_terms(self.layer, x, ctx) if scheme.reads_input else None
        if cache is None:
            y = attend(q, k, v, scheme, self.layer, pos, plan, ctx, self.kernel, terms)
        else:
            y = cached_attention(q, k, v, scheme, self.layer, pos, plan, ctx, cache.layer(self.layer), terms)
        return self.drop(self.proj(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, layers: list[LayerSpec] | None):
        super().__init__()
        self.norm1 = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer, layers)
        # A parallel block's MLP reads norm1's output too.
        self.norm2 = None if cfg.parallel else build_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.mlp = moe.Experts(cfg) if cfg.mlp == "moe" else MLP(cfg)
        self.attn_post_norm = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps) if cfg.post_norms else None
        self.mlp_post_norm = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps) if cfg.post_norms else None

    def forward(self, x, scheme, pos, plan, ctx, cache=None):
        h = self.norm1(x)
        a = self.attn(h, scheme, pos, plan, ctx, cache)
        if self.norm2 is None:
            return x + a + self.mlp(h)
        if self.attn_post_norm is not None:
            a = self.attn_post_norm(a)
        x = x + a
        m = self.mlp(self.norm2(x))
        if self.mlp_post_norm is not None:
            m = self.mlp_post_norm(m)
        return x + m


class TransformerLM(nn.Module):
    def __init__(self, cfg: ModelConfig, pos: dict, scaling: dict | None = None, layers=UNRESOLVED):
        """`layers`: the layer specs ModelConfig.resolve(pos) gave where the
        settings were resolved (a run's RunConfig.layers); left out, the
        settings are resolved here."""
        super().__init__()
        self.cfg = cfg
        self.layout = cfg.resolve(pos) if layers is UNRESOLVED else layers
        self._pos = pos
        self._install_schemes(_layer_schemes(self.layout, pos, cfg.dims()))
        self._plain = build_scaling(None)
        self.set_scaling(scaling)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i, self.layout) for i in range(cfg.n_layer))
        self.norm = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init of residual projections keeps the residual stream's
        # variance independent of depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / (2 * cfg.n_layer) ** 0.5)

    def _install_schemes(self, layer_schemes):
        # The first layer's scheme keeps the name `pos_scheme` (state-dict keys of
        # models without a layout unchanged); a layout's other schemes follow.
        self.pos_scheme = layer_schemes[0]
        others = []
        for scheme in layer_schemes:
            if scheme is not self.pos_scheme and all(scheme is not o for o in others):
                others.append(scheme)
        self.layout_schemes = nn.ModuleList(others) if others else None
        self._layer_schemes = layer_schemes  # a plain list: the modules are registered above

    def rebuild_schemes(self, device="cpu"):
        """Every layer's scheme built afresh on `device`: a model made on the
        meta device gets its schemes' computed buffers (not in a checkpoint)
        this way. A scheme's learned parameters would start anew: for models
        whose schemes have none (rope, nope: every Hugging Face import)."""
        with torch.device(device):
            self._install_schemes(_layer_schemes(self.layout, self._pos, self.cfg.dims()))
        self.set_scaling(self.scaling)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def set_scaling(self, scaling):
        """Swap the extrapolation method (a config dict or a ScalingMethod)."""
        method = build_scaling(scaling) if scaling is None or isinstance(scaling, dict) else scaling
        self.scaled_layers = _active_layers(method, self.layout, self._layer_schemes)
        self.scaling = method

    @property
    def plain_label(self) -> str:
        """The label of no method (plain positions), as results name it."""
        return self._plain.label

    def plain_at(self, seq_len: int) -> bool:
        """Whether the method changes nothing at seq_len, so that this model computes there exactly what it
        computes with no method (YaRN or PI with factor auto at or below the training length): on every
        layer it acts on, the positions, the attention plan and the rotary frequencies and factor are
        plain positions'. Only rotary layers are judged (a rotary scheme reads the method through these
        hooks alone); any other scheme under the method answers False. The model's mode counts, as in a
        forward: a method acting only at evaluation is plain in training. tests/test_plain_at.py holds every
        method's logits to plain positions' wherever this says True."""
        method, plain = self.scaling, self._plain
        if not self.scaled_layers or type(method) is type(plain) and not method.logn:
            return True
        ctx = self.context(seq_len)
        plain_ctx = replace(ctx, scaling=plain, memo={})
        pos = torch.arange(seq_len)
        for scheme in {id(self._layer_schemes[i]): self._layer_schemes[i] for i in self.scaled_layers}.values():
            spec = scheme.rotary
            if spec is None:
                return False
            mapped = method.map_positions(pos, scheme, ctx)
            if mapped.shape != pos.shape or not torch.equal(mapped, pos):
                return False
            if not _plain_plan(method.attention_plan(mapped, ctx)):
                return False
            inv_freq, factor = method.rope_frequencies(spec.rot_dim, spec.base, ctx)
            inv_plain, factor_plain = plain.rope_frequencies(spec.rot_dim, spec.base, plain_ctx)
            if factor != factor_plain or not torch.equal(inv_freq.float(), inv_plain.float()):
                return False
        return True

    @property
    def method_scheme(self):
        """The scheme of the first layer the current method acts on (a layout's first scaled layer: Gemma 3's
        first global one), the first layer's where it acts on none."""
        return self._layer_schemes[self.scaled_layers[0] if self.scaled_layers else 0]

    def scaled_rotary(self):
        """The rotary spec (rot_dim, base) of the layers a frequency method (PI, YaRN, LongRoPE, ...) acts
        on: what sizes and seeds a per-pair setting such as LongRoPE's factors. Under a layout these are its
        scaled layers (Gemma 3's global ones at base 1M, where the first layer is a local one at 10k).
        Refuses layers whose frequencies differ, which no one list of factors fits."""
        layers = (
            range(len(self._layer_schemes))
            if self.layout is None
            else [i for i, s in enumerate(self.layout) if s.scaled]
        )
        found = {}
        for i in layers:
            spec = self._layer_schemes[i].rotary
            if spec is not None:
                found.setdefault((spec.rot_dim, spec.base), (spec, []))[1].append(i)
        if len(found) != 1:
            shown = "; ".join(f"layers {ls}: {d} rotary dims at base {b:g}" for (d, b), (_, ls) in found.items())
            acts_on = f"rotary layers of different frequencies ({shown})" if found else "no rotary layer"
            raise ConfigError(
                f"A frequency method would act on {acts_on}, so no one per-pair setting fits them all. Let it act "
                f"on layers of one kind (scripts/eval_extrapolation.py's scaled_layers=; Gemma 3's default is its "
                f"global layers), or use a model whose layers share one RoPE."
            )
        return next(iter(found.values()))[0]

    def validate_length(self, seq_len: int):
        _validate_length(seq_len, self.scaling, self._layer_schemes, self.scaled_layers, self.cfg.train_len)

    def describe_scaling(self, seq_len: int) -> dict:
        """The method's realized settings at seq_len (results.json), and under a
        layout the layers it acts on."""
        out = self.scaling.describe(self.method_scheme, self.context(seq_len))
        if self.layout is not None:
            out["layers"] = list(self.scaled_layers)
        return out

    def num_params(self, non_embedding=True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.wte.weight.numel() if non_embedding else n

    def context(self, seq_len: int) -> PosContext:
        """What the positional and scaling hooks see for a sequence of seq_len tokens."""
        return PosContext(
            seq_len=seq_len,
            train_len=self.cfg.train_len,
            scaling=self.scaling,
            tuned_len=self.cfg.tuned_len,
            training=self.training,
        )

    def forward(
        self, idx: torch.Tensor, pos: torch.Tensor | None = None, cache: KVCache | None = None, shards=None
    ) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab)."""
        return self.lm_head(self.hidden(idx, pos, cache, shards))

    def hidden(
        self, idx: torch.Tensor, pos: torch.Tensor | None = None, cache: KVCache | None = None, shards=None
    ) -> torch.Tensor:
        """idx (B, T) -> final normed hidden states (B, T, d_model), what
        lm_head projects: for losses computed a chunk at a time (rope_lm.model.head).
        A model.logit_scale multiplies them here, so every reader of the
        logits (loss chunks, decoding) gets the scaled ones.

        With a cache (rope_lm.model.kv_cache), idx are the next T tokens after the
        ones it holds: they are read at the positions that follow, attend to
        every token held, and are appended to it.

        With shards (rope_lm.core.sequence_shards.SequenceShards: context
        parallelism), idx are this device's tokens of a sequence split over
        its group, and pos, if given, the ids of the whole sequence."""
        T = idx.shape[1] if shards is None else shards.seq_len
        start = 0
        if shards is not None and cache is not None:
            raise ValueError("shards and cache exclude each other: a KV cache decodes on one device.")
        if cache is not None:
            if pos is not None:
                raise ValueError(
                    "pos and cache exclude each other: a cache reads tokens at the positions after the ones it holds."
                )
            start = cache.begin(idx.shape[0], T)
        ctx = self.context(T if cache is None else cache.seq_len(T))
        ctx.shards = shards
        if cache is not None:
            ctx.state = cache.state
        if pos is None:
            pos = torch.arange(start + T, device=idx.device)
        if self.layout is not None:
            x = self._layout_blocks(idx, pos, start, ctx, cache)
        else:
            pos = self.scaling.map_positions(pos, self.pos_scheme, ctx)
            plan = self.scaling.attention_plan(pos, ctx)
            x = self.drop(self.pos_scheme.embed(self.embed_tokens(idx), own_positions(pos, start, shards), ctx))
            for block in self.blocks:
                x = run_block(block, x, self.pos_scheme, pos, plan, ctx, cache, self.cfg.activation_checkpointing)
        if cache is not None:
            cache.commit(T)
        x = self.norm(x)
        return x if self.cfg.logit_scale is None else x * self.cfg.logit_scale

    def embed_tokens(self, idx):
        x = self.wte(idx)
        # the scale rounded to the weights' dtype first, as Gemma's checkpoints were trained with it
        return x if self.cfg.embed_scale is None else x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)

    def _layout_blocks(self, idx, pos, start, ctx, cache):
        """The blocks under a layout: each layer with its scheme, its window,
        and the method where it acts (positions and plans computed once per
        scheme and method)."""
        groups = {}
        x = self.drop(self.embed_tokens(idx))
        for i, block in enumerate(self.blocks):
            scheme, spec = self._layer_schemes[i], self.layout[i]
            method = self.scaling if i in self.scaled_layers else self._plain
            key = (id(scheme), id(method))
            if key not in groups:
                gctx = replace(ctx, scaling=method, memo={})
                gpos = method.map_positions(pos, scheme, gctx)
                groups[key] = (gctx, gpos, method.attention_plan(gpos, gctx))
            gctx, gpos, plan = groups[key]
            if spec.window is not None:
                plan = replace(
                    plan,
                    window=min(spec.window, plan.window or spec.window),
                    sink_tokens=max(spec.sinks, plan.sink_tokens),
                )
            # Each layer's own carried state (a recurrent scheme at two layers reads two inputs).
            lctx = replace(gctx, state=(cache.state if cache is not None else {}).setdefault(i, {}))
            x = scheme.embed(x, own_positions(gpos, start, ctx.shards), lctx)
            x = run_block(block, x, scheme, gpos, plan, lctx, cache, self.cfg.activation_checkpointing)
        return x


def _plain_plan(plan) -> bool:
    """An attention plan that asks nothing beyond causal attention (what plain positions plan)."""
    return (
        all(getattr(plan, f.name) is None for f in fields(plan) if f.name not in ("sink_tokens",))
        and not plan.sink_tokens
    )


def own_positions(pos: torch.Tensor, start: int, shards) -> torch.Tensor:
    """The positions of the tokens this call reads out of pos (every token's):
    the ones after a KV cache's, or this device's share under context parallelism."""
    return pos[start:] if shards is None else pos[shards.q_index.to(pos.device)]


def build_model(
    model: dict,
    pos: dict,
    scaling: dict | None,
    vocab_size: int,
    train_len: int,
    tuned_len: int | None = None,
    layers=UNRESOLVED,
) -> TransformerLM:
    """A model from checked settings (rope_lm.runs.config.resolve_run checks a
    run's, and resolves its `layers`)."""
    cfg = ModelConfig(
        vocab_size=vocab_size,
        train_len=train_len,
        tuned_len=tuned_len,
        **{k: v for k, v in model.items() if k != "name"},
    )
    return TransformerLM(cfg, pos, scaling, layers)


__all__ = ["ModelConfig", "TransformerLM", "build_model", "asdict"]
