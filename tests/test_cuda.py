"""The CUDA paths, checked on a GPU (skipped where there is none, as in CI):
compiled flex attention and CUDA SDPA equal the explicit reference for every
scheme that takes them (outputs and gradients, scheme parameters included,
with windows, query scales, StreamingLLM sink tokens and gpt-oss sink logits;
a scheme that owns its attention on its own fast path, terms from a layer input),
the KV cache equals one full forward on CUDA for every scheme and method,
context parallelism's FlexAttention path equals one process, and
a model trains in bfloat16 autocast with fused AdamW as the pipeline runs it.

    python -m pytest tests/test_cuda.py -n 8      # on a GPU machine (docs/benchmarks.md "GPU rows")

ROPE_LM_TEST_DEVICE=cpu runs the same checks on CPU (flex eagerly), which is
how they are kept working between GPU sessions."""

import os
import sys

import pytest
import torch
import torch.nn.attention.flex_attention  # noqa: F401 (patched on CPU below)

from rope_lm.kernels import attention
from rope_lm.kernels.attention import AttnPlan, attend, explicit_attention
from rope_lm.model.kv_cache import KVCache
from rope_lm.positional import SCHEMES, Dims, PosContext
from rope_lm.scaling import build_scaling
from tests.test_attention import LAYER
from tests.test_attention import assert_same as same
from tests.test_attention import make_scheme as attention_scheme
from tests.test_context_parallel import make_plan, served_cases, split_against_whole
from tests.test_kv_cache import PAIRS, PIECES, model, read_in_pieces, tokens

DEVICE = torch.device(os.environ.get("ROPE_LM_TEST_DEVICE", "cuda"))
pytestmark = [
    pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]

# Long enough for several of flex's 128-token blocks, and for windows and
# sinks to cut whole blocks out of the block mask. Compiled flex needs heads
# of at least 16 channels (torch 2.11); a smaller head falls back to SDPA.
B, T = 2, 300
DIMS = Dims(d_model=64, n_head=4, head_dim=16, n_layer=2, train_len=16)


def make_scheme(name):
    return attention_scheme(name, DIMS).to(DEVICE)


def plans():
    H = DIMS.n_head
    return {
        "plain": AttnPlan(),
        "window+q_scale": AttnPlan(window=150, q_scale=torch.linspace(0.5, 1.5, T, device=DEVICE)),
        "window+sink_tokens": AttnPlan(window=100, sink_tokens=4),
        "sink_logits": AttnPlan(sink_logits=torch.linspace(-1.0, 2.0, H, device=DEVICE)),
    }


def ctx():
    return PosContext(seq_len=T, train_len=DIMS.train_len, scaling=build_scaling(None))


def positions(kind):
    pos = torch.arange(T, device=DEVICE)
    return pos if kind == "int" else pos * 0.75 + 2.5


def fixed_kernels(name):
    """The kernels checked against explicit: for a scheme that owns its
    attention, its fast path as "sdpa" and "auto" ask for it (auto: its flex
    on CUDA, where it has one)."""
    cls = SCHEMES.get(name)
    if cls.owns_attention:
        return ["sdpa", "auto"]
    return [] if cls.has_content_terms else ["sdpa", "flex"]


def outputs_and_grads(kernel, scheme, pos, plan, grads=True):
    torch.manual_seed(1)
    q, k, v = (torch.randn(B, DIMS.n_head, T, DIMS.head_dim, device=DEVICE, requires_grad=grads) for _ in range(3))
    weights = torch.randn(B, DIMS.n_head, T, DIMS.head_dim, device=DEVICE)
    c = ctx()
    if scheme.owns_attention:
        x = torch.randn(B, T, DIMS.d_model, device=DEVICE, requires_grad=grads) if scheme.reads_input else None
        terms = scheme.token_terms(LAYER, x, c) if x is not None else None
        out = attend(q, k, v, scheme, LAYER, pos, plan, c, kernel, terms)
        if not grads:
            return out, ()
        params = [p for p in scheme.parameters() if p.requires_grad]
        inputs = [q, k, v, *([x] if x is not None else []), *params]
        return out.detach(), torch.autograd.grad((out * weights).sum(), inputs, allow_unused=True)
    if kernel == "explicit":
        out = explicit_attention(q, k, v, scheme, LAYER, pos, plan, c)
    elif kernel == "flex" and DEVICE.type == "cpu":
        # compiled flex has no CPU backward; the eager one checks the same score_mods here
        qr, kr = scheme.rotate(q, k, pos, pos, LAYER, c)
        qr = qr if plan.q_scale is None else qr * plan.q_scale[:, None]
        out = attention.flex_path(qr, kr, v, scheme, LAYER, pos, plan, c, compiled=False)
    else:
        out = attend(q, k, v, scheme, LAYER, pos, plan, c, kernel)
    if not grads:
        return out, ()
    params = [p for p in scheme.parameters() if p.requires_grad]
    return out.detach(), torch.autograd.grad((out * weights).sum(), [q, k, v, *params], allow_unused=True)


def assert_same(name, got, want):
    # Inductor's and cuBLAS's reductions run in another order than the reference's.
    same(name, got, want, tol=(2e-4, 1e-3), grad_tol=(5e-4, 2e-3))


@pytest.fixture(autouse=True)
def full_precision_matmuls():
    # The reference and the kernels are compared in float32; TF32 would differ by 1e-3 relative.
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture
def flex_must_run(monkeypatch):
    """A compiled flex that fails falls back to sdpa with a warning; here that is a failure."""
    real = attention.flex_path

    def strict(*args, **kwargs):
        out = real(*args, **kwargs)
        assert out is not None, "flex_path fell back to sdpa"
        return out

    monkeypatch.setattr(attention, "flex_path", strict)
    if DEVICE.type == "cpu":  # torch refuses flex backward on CPU up front; its eager reference runs
        module = sys.modules["torch.nn.attention.flex_attention"]
        monkeypatch.setattr(module, "_validate_device", lambda *args: None)


@pytest.mark.parametrize("name,kernel", [(n, k) for n in SCHEMES.names() for k in fixed_kernels(n)])
def test_kernels_match_explicit_on_the_device(name, kernel, flex_must_run):
    """Training (gradients) where the kernel trains the scheme, inference (no gradients) always."""
    scheme = make_scheme(name)
    kinds = ["int", "float"] if SCHEMES.get(name).has_bias else ["int"]
    trains = kernel != "flex" or scheme.flex_trains
    for case, plan in plans().items():
        for kind in kinds:
            pos = positions(kind)
            if kernel == "flex" and not scheme.has_bias and not (plan.window or plan.sink_logits is not None):
                continue  # attend() sends a plain causal unbiased scheme to SDPA whatever is asked
            if scheme.owns_attention and plan.sink_logits is not None and not scheme.serves_sink_logits:
                continue  # refused in one paragraph (tests/test_attention.py)
            label = f"{name}/{kernel}/{case}/{kind}"
            with torch.no_grad():
                got = outputs_and_grads(kernel, scheme, pos, plan, grads=False)
            assert_same(label + "/inference", got, outputs_and_grads("explicit", scheme, pos, plan, grads=False))
            if trains:
                ref = outputs_and_grads("explicit", scheme, pos, plan)
                assert_same(label, outputs_and_grads(kernel, scheme, pos, plan), ref)
    # A scheme's own flex that failed to compile falls back to its sdpa path with a warning; here that fails.
    assert DEVICE.type not in getattr(scheme, "flex_failed_on", ()), f"{name}: its compiled flex fell back"


@pytest.mark.parametrize("scheme,method", PAIRS)
def test_cached_reading_equals_one_full_forward_on_the_device(scheme, method):
    m = model(scheme, method).to(DEVICE)
    idx = tokens(40).to(DEVICE)
    with torch.no_grad():
        full = m(idx)
        cache = KVCache(planned_len=40)
        cached = read_in_pieces(m, idx, cache, PIECES)
    torch.testing.assert_close(cached, full, atol=2e-4, rtol=1e-3, msg=f"{scheme} under {method}")


@pytest.mark.parametrize("pos_name", ["rope", "alibi", "fire"])
def test_a_model_trains_in_bfloat16_with_fused_adamw(pos_name):
    """What the pipeline does on CUDA (bf16 autocast, fused AdamW, auto kernel:
    flex with gradients for a bias scheme): the loss falls on a batch it sees
    again, and the bf16 forward stays near the float32 one."""
    if DEVICE.type != "cuda":
        pytest.skip("bfloat16 autocast and fused AdamW are the CUDA path")
    from rope_lm.model.transformer import TransformerLM
    from tests.test_kv_cache import config, method_options, pos_options

    torch.manual_seed(0)
    m = TransformerLM(
        config(n_layer=2, d_model=64, n_head=4, n_kv_head=4), pos_options(pos_name), method_options("none")
    ).to(DEVICE)
    idx = tokens(129, batch=8).to(DEVICE)
    with torch.no_grad():
        ref = m(idx[:, :-1])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            low = m(idx[:, :-1])
    torch.testing.assert_close(low.float(), ref, atol=0.1, rtol=0.05)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)
    losses = []
    for _ in range(40):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = m(idx[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(map(torch.isfinite, map(torch.tensor, losses))), losses
    assert losses[-1] < 0.5 * losses[0], losses  # float32 on CPU: 4.1 to 0.3-0.6 in 40 steps


@pytest.mark.parametrize("name,plan,kind", served_cases())
def test_context_parallel_flex_equals_one_process_on_the_device(name, plan, kind):
    """Context parallelism's CUDA path (rope_lm/kernels/sharded_sequence.py):
    each device's queries over the gathered keys through compiled
    FlexAttention, outputs and gradients, equal the explicit attention over
    the whole sequence (the devices of the group in one process; on CPU the
    flex forward only, eagerly)."""
    grads = DEVICE.type == "cuda"
    got, want = split_against_whole(name, make_plan(plan, DIMS.n_head, DEVICE), kind, "flex", DEVICE, DIMS, grads=grads)
    assert_same(f"{name}/{plan}/{kind}/context-parallel flex", got, want)
