"""FIRE (Li et al., 2024, "Functional Interpolation for Relative Positions
Improves Long Context Transformers", ICLR): a learned function of the
progressively normalised distance, per head, in every layer:

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1)

f_theta is an MLP 1 -> width -> n_head with ReLU; c and L are learnable
(initialised to 0.1 and, by default, to the training length: the paper's
reference code starts L at 512, the length it trained at, and learns L as a
multiplier of its initial value; |.| keeps both valid if a step pushes them
negative). A threshold above the training length would normalise every
trained distance by a length the model never sees. i is the query's position, so the bias is relative only
while i < L; past L the normaliser grows and the input stays in [0, 1],
which is what lets FIRE interpolate instead of extrapolate.
"""

import torch
from torch import nn

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES, _fire_kernel
from rope_lm.positional._common import PairwiseBias, causal_distance, integer_valued

EPS = 1e-6


class FireLayer(nn.Module):
    def __init__(self, n_head: int, width: int, init_c: float, init_L: float):
        super().__init__()
        # nn.Linear's default init (uniform, +-1/sqrt(fan_in)), kept in plain
        # parameters so the model's own init (normal 0.02 for nn.Linear) does
        # not flatten the function at the start.
        self.w1 = nn.Parameter(torch.empty(width).uniform_(-1.0, 1.0))
        self.b1 = nn.Parameter(torch.empty(width).uniform_(-1.0, 1.0))
        bound = width**-0.5
        self.w2 = nn.Parameter(torch.empty(n_head, width).uniform_(-bound, bound))
        self.b2 = nn.Parameter(torch.empty(n_head).uniform_(-bound, bound))
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("init_L", torch.tensor(float(init_L)), persistent=False)


@SCHEMES.register("fire")
class Fire(PairwiseBias):
    distance_only = False  # the normaliser reads the query's own position
    flex_trains = False  # its score_mod reads w1, b1 and w2 once per hidden unit

    def __init__(self, dims, mlp_width: int = 32, init_c: float = 0.1, init_L: float | None = None):
        super().__init__(dims)
        if init_L is None:  # the training length (a number given, as checkpoints hold, is kept)
            init_L = float(dims.train_len)
        if not isinstance(mlp_width, int) or mlp_width < 1:
            raise ConfigError(f"pos.mlp_width={mlp_width!r} must be a positive integer.")
        if not (init_c > 0 and init_L > 0):
            raise ConfigError(f"pos.init_c={init_c} and pos.init_L={init_L} must be positive.")
        self.layers = nn.ModuleList(FireLayer(dims.n_head, mlp_width, init_c, init_L) for _ in range(dims.n_layer))

    def coefficients(self, layer, ctx):
        # Every tensor is indexed by the head inside the score_mod: flex
        # attention's backward gathers gradients of captured tensors through
        # such (b, h, q, kv)-indexed reads, not through broadcast ones.
        f, H = self.layers[layer], self.dims.n_head
        width = f.w1.shape[0]
        c, L = self._c_and_L(layer)
        return (f.w1.expand(H, width), f.b1.expand(H, width), f.w2, f.b2, c.expand(H), L.expand(H))

    def _c_and_L(self, layer):
        f = self.layers[layer]
        return f.c.abs(), (f.L_multiplier * f.init_L).abs()

    @staticmethod
    def normalised(distance, q_pos, c, L):
        return torch.log1p(c * distance) / (torch.log1p(c * torch.maximum(q_pos, L)) + EPS)

    @staticmethod
    def formula(coefs, h, q_pos, k_pos):
        # Pointwise for flex attention: the hidden layer is unrolled, since a
        # compiled score_mod cannot contain a reduction.
        w1, b1, w2, b2, c, L = coefs
        x = Fire.normalised((q_pos - k_pos).clamp(min=0), q_pos, c[h], L[h])
        out = b2[h]
        for u in range(w1.shape[-1]):
            out = out + w2[h, u] * torch.relu(x * w1[h, u] + b1[h, u])
        return out

    def distance_bias(self, layer, pos, ctx):
        f = self.layers[layer]
        c, L = self._c_and_L(layer)
        p = pos.to(torch.float32)
        # Only while every query is within L is the normaliser psi(L) for all
        # rows, and the bias a function of the distance alone.
        if bool(p.max() > L):
            return None
        x = self.normalised(p - p[0], L, c, L)
        return (torch.relu(x[:, None] * f.w1 + f.b1) @ f.w2.t() + f.b2).t()

    def bias(self, layer, q_pos, k_pos, ctx):
        f = self.layers[layer]
        c, L = self._c_and_L(layer)
        x = self.normalised(causal_distance(q_pos, k_pos), q_pos.to(torch.float32)[:, None], c, L)
        if not (torch.is_grad_enabled() and f.w1.requires_grad):
            return self._piecewise(layer, ctx)(x)
        hidden = torch.relu(x[..., None] * f.w1 + f.b1)  # (Tq, Tk, width)
        return (hidden @ f.w2.t() + f.b2).permute(2, 0, 1)

    def masked_bias(self, layer, pos, start, end, window, ctx):
        # Past L on the CPU, the bias and the mask in one pass (_fire_kernel);
        # it reads psi by distance, so the positions must be 0, 1, 2, ...
        # shifted by a constant, as in every evaluation without a position map.
        if pos.device.type != "cpu" or not _fire_kernel.available():
            return None
        key = ("fire_rows", id(self), layer)
        if key not in ctx.memo:
            ctx.memo[key] = self._rows(layer, pos)
        rows = ctx.memo[key]
        if rows is None:
            return None
        psi, den = rows
        knots, slope, intercept = self._segments(layer, ctx)
        H = self.dims.n_head
        size = H * (end - start) * end
        buffer = ctx.memo.get("fire_mask_buffer")
        if buffer is None or buffer.numel() < size:
            # One buffer for every block and layer, sized for the widest block
            # (keys up to the last position): a fresh tensor of this size per
            # block costs more in page faults than the bias itself.
            buffer = ctx.memo["fire_mask_buffer"] = torch.empty(max(size, H * (end - start) * pos.numel()))
        out = buffer[:size].view(H, end - start, end)
        return _fire_kernel.masked_bias(out, psi, den, start, window, knots, slope, intercept)

    def _rows(self, layer, pos):
        """(psi by index distance, normaliser by query index), float32, or
        None where the positions are not consecutive integers."""
        steps = pos[1:] - pos[:-1]
        if not integer_valued(pos) or (steps.numel() and not bool((steps == 1).all())):
            return None
        c, L = self._c_and_L(layer)
        p = pos.to(torch.float32)
        psi = torch.log1p(c * (p - p[0]))
        den = torch.log1p(c * torch.maximum(p, L)) + EPS
        return psi.contiguous(), den.contiguous()

    def _segments(self, layer, ctx):
        """f_theta is a ReLU network of one input, so it is piecewise linear
        with a knot where each hidden unit turns on. Per segment between the
        sorted knots (K,), f = slope[s, h] * x + intercept[s, h] ((K + 1, H)
        each); x falls in segment bucketize(x, knots)."""
        key = ("fire_piecewise", id(self), layer)
        if key not in ctx.memo:
            f = self.layers[layer]
            w1, b1, w2, b2 = f.w1.float(), f.b1.float(), f.w2.float(), f.b2.float()
            moving = w1 != 0
            knots = torch.sort(-b1[moving] / w1[moving]).values
            # One point inside each segment decides which units are on there.
            if knots.numel():
                inner = (knots[1:] + knots[:-1]) / 2
                probes = torch.cat((knots[:1] - 1, inner, knots[-1:] + 1))
            else:
                probes = torch.zeros(1, device=w1.device)
            on = (probes[:, None] * w1 + b1 > 0).to(w2.dtype)  # (segments, width)
            slope = on @ (w2 * w1).t()  # (segments, H)
            intercept = on @ (w2 * b1).t() + b2
            ctx.memo[key] = (knots.contiguous(), slope.contiguous(), intercept.contiguous())
        return ctx.memo[key]

    def _piecewise(self, layer, ctx):
        """Inference: one search for the segment (shared by the heads) and two
        gathers replace the (Tq, Tk, width) hidden layer. The same function up
        to float rounding (f is continuous, so a point on a knot may take
        either side)."""
        knots, slope, intercept = self._segments(layer, ctx)

        def evaluate(x):
            seg = torch.bucketize(x, knots)
            return (slope[seg] * x[..., None] + intercept[seg]).permute(2, 0, 1)

        return evaluate
