"""Context parallelism (trainer.context_parallel; rope_lm/core/sequence_shards.py,
rope_lm/kernels/sharded_sequence.py, rope_lm/train/context_parallel.py) on two
CPU processes over gloo: each holds half of every sequence (PyTorch's
head-tail shards) and attends over the keys of both, and the loss and every
gradient equal one process's on the whole sequence, for each kind of scheme,
method and per-layer option it serves. Plus the settings it refuses, each
before any work, in one paragraph."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rope_lm.core.errors import ConfigError
from rope_lm.core.sequence_shards import SequenceShards, head_tail_order
from rope_lm.model.transformer import ModelConfig, TransformerLM

T = 24  # 2 devices x 2 chunks of 6
VOCAB = 61

# (label, model options, pos, scaling, training-time position ids): every path the sharded kernel takes
# on CPU: a rotation (grouped heads), biases (ALiBi, T5's buckets, FIRE's network), no position, an absolute
# table, a method that changes frequencies and one that scales queries (log-n in training), windows and
# their sink tokens in a layout that mixes schemes, Llama 4's temperature, SSMax and gpt-oss's sink logits,
# and positions that are not 0..T-1 (PoSE-style ids).
CASES = [
    ("rope, grouped heads", {"n_kv_head": 2}, {"name": "rope"}, None, None),
    ("alibi", {}, {"name": "alibi"}, None, None),
    ("t5", {}, {"name": "t5"}, None, None),
    ("fire", {}, {"name": "fire"}, None, None),
    ("kerple", {}, {"name": "kerple"}, None, None),
    ("sandwich", {}, {"name": "sandwich"}, None, None),
    ("xpos", {}, {"name": "xpos"}, None, None),
    ("multiplicative", {}, {"name": "multiplicative"}, None, None),
    ("nope", {}, {"name": "nope"}, None, None),
    ("learned", {}, {"name": "learned"}, None, None),
    ("rope + yarn", {}, {"name": "rope"}, {"name": "yarn", "factor": 4.0}, None),
    ("rope + log-n in training", {}, {"name": "rope"}, {"name": "logn", "logn_in_training": True}, None),
    (
        "layout: windows with sinks, alibi and nope layers",
        {
            "n_layer": 4,
            "layout": {"pattern": [{"window": 5, "sinks": 2}, {"pos": {"name": "alibi"}}, {"window": 7}, "nope"]},
        },
        {"name": "rope"},
        None,
        None,
    ),
    (
        "temperature, ssmax, sink logits",
        {
            "softmax": {
                "temperature": {"floor_scale": 4, "attn_scale": 0.1},
                "ssmax": {"init": "auto"},
                "sink_logits": True,
            }
        },
        {"name": "rope"},
        None,
        None,
    ),
    ("rope at PoSE-style ids", {}, {"name": "rope"}, None, "skip"),
]


def build(options, pos, scaling):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, train_len=16, n_head=4, d_model=32, **{"n_layer": 2, **options})
    return TransformerLM(cfg, pos, scaling)


def ids_for(kind):
    if kind == "skip":  # two runs of positions with a jump between them, as PoSE trains
        return torch.cat((torch.arange(10), torch.arange(40, 40 + T - 10)))
    return None


def loss_of(model, x, y, pos, shards=None):
    logits = model(x, pos, shards=shards)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def _worker(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    from rope_lm.train.context_parallel import sequence_shards, split

    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("data_parallel", "tensor_parallel"))
    shards = sequence_shards(mesh, T, "cpu")
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, T + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    out = {}
    for label, options, pos, scaling, ids in CASES:
        model = build(options, pos, scaling).train()
        positions = ids_for(ids)
        whole = loss_of(model, x, y, positions)
        whole.backward()
        want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        xs, ys = split(x, y, shards)
        mine = loss_of(model, xs, ys, positions, shards)
        mine.backward()
        # What FSDP's reduction and the logged mean do: the mean over the group's devices.
        got_loss = mine.detach().clone()
        dist.all_reduce(got_loss)
        got_loss /= world
        worst = 0.0
        for n, p in model.named_parameters():
            if p.grad is None:
                continue
            grad = p.grad.clone()
            dist.all_reduce(grad)
            grad /= world
            # How far past torch.allclose(rtol=1e-4, atol=1e-6) the worst entry is (<= 0: within).
            worst = max(worst, ((grad - want[n]).abs() - 1e-4 * want[n].abs()).max().item())
        out[label] = (
            float(whole),
            float(got_loss),
            worst,
            sorted(want) == sorted(n for n, p in model.named_parameters() if p.grad is not None),
        )
    if rank == 0:
        results.update(out)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks():
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(2, free_port(), results), nprocs=2, join=True)
    return dict(results)


@pytest.mark.parametrize("label", [c[0] for c in CASES])
def test_two_ranks_give_the_loss_and_gradients_of_one_process(two_ranks, label):
    whole, sharded, worst_grad, same_params = two_ranks[label]
    assert sharded == pytest.approx(whole, rel=1e-6, abs=1e-6)
    assert worst_grad <= 1e-6, f"a gradient entry differs by {worst_grad:.2e} beyond rtol 1e-4"
    assert same_params


def test_the_shards_are_the_ones_pytorch_context_parallelism_makes():
    """head_tail_order is torch's head-tail load balancer: device r holds
    chunks r and 2K-1-r of 2K, so every device has the same number of
    visible (causal) pairs."""
    order = head_tail_order(16, 2)
    assert order.tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    pairs = [sum(int(i) + 1 for i in order[r * 8 : (r + 1) * 8]) for r in range(2)]
    assert pairs[0] == pairs[1]
    for rank in range(2):  # the runs the kernel reads: contiguous stretches of this device's tokens
        shards = SequenceShards(16, rank, 2, "", order)
        rows = [first + i for first, end, start in shards.runs() for i in range(end - first)]
        tokens = [start + i for first, end, start in shards.runs() for i in range(end - first)]
        assert rows == list(range(8)) and tokens == shards.q_index.tolist()


# --- the kernel alone: every device of a group in one process -------------------------------------------


class OneProcessShards(SequenceShards):
    """Device `rank` of a group whose every device lives in this process: the
    gather reads the whole sequence's rotated keys and values (what the K
    devices would send, in group order), so the kernel's math is checked
    without a process group (the gather's own backward is PyTorch's, checked on
    two ranks above)."""

    def __init__(self, seq_len, rank, size, whole_k, whole_v):
        super().__init__(seq_len, rank, size, "", head_tail_order(seq_len, size, whole_k.device))
        object.__setattr__(self, "whole", (whole_k, whole_v))

    def gather(self, k, v):
        order = self.k_index.to(k.device)
        return self.whole[0][:, :, order], self.whole[1][:, :, order]


def split_against_whole(name, plan, kind, kernel, device, dims, grads=True, size=2):
    """(outputs, gradients) of the sharded kernel, each device's rows put back
    in the sequence's order and its loss summed over devices, and the same of
    explicit attention over the whole sequence: they must be equal."""
    from rope_lm.kernels import sharded_sequence
    from rope_lm.kernels.attention import explicit_attention
    from rope_lm.positional import PosContext
    from rope_lm.scaling import build_scaling
    from tests.test_attention import LAYER, make_scheme

    scheme = make_scheme(name, dims).to(device)
    n = 24
    pos = torch.arange(n, device=device)
    pos = pos if kind == "int" else pos * 0.75 + 2.5
    torch.manual_seed(1)
    q = torch.randn(2, dims.n_head, n, dims.head_dim, device=device, requires_grad=grads)
    k, v = (torch.randn(2, dims.n_head // 2, n, dims.head_dim, device=device, requires_grad=grads) for _ in range(2))
    weights = torch.randn(2, dims.n_head, n, dims.head_dim, device=device)
    params = [p for p in scheme.parameters() if p.requires_grad]
    inputs = [q, k, v, *params]

    def context():
        return PosContext(seq_len=n, train_len=dims.train_len, scaling=build_scaling(None))

    def result(out):
        if not grads:
            return out.detach(), ()
        return out.detach(), torch.autograd.grad((out * weights).sum(), inputs, allow_unused=True)

    want = result(explicit_attention(q, k, v, scheme, LAYER, pos, plan, context()))
    c = context()
    kr = scheme.rotate(k, k, pos, pos, LAYER, c)[1]
    rows = []
    for rank in range(size):
        c.shards = OneProcessShards(n, rank, size, kr, v)
        idx = c.shards.q_index
        rows.append(
            (
                idx,
                sharded_sequence.attention(
                    q[:, :, idx], k[:, :, idx], v[:, :, idx], scheme, LAYER, pos, plan, c, kernel
                ),
            )
        )
        c = context()
    out = torch.empty_like(rows[0][1]).repeat(1, 1, size, 1)
    for idx, y in rows:
        out = out.index_copy(2, idx.long(), y)
    return result(out), want


def served_cases():
    from rope_lm.positional import SCHEMES
    from tests.test_attention import DIMS, make_scheme

    names = [n for n in SCHEMES.names() if make_scheme(n, DIMS).why_not_split() is None]
    return [
        (n, p, kind)
        for n in names
        for p in PLANS
        for kind in (["int", "float"] if SCHEMES.get(n).has_bias else ["int"])
    ]


PLANS = ["plain", "window+q_scale", "window+sink_tokens", "sink_logits"]


def make_plan(name, n_head, device="cpu"):
    from rope_lm.kernels.attention import AttnPlan

    return {
        "plain": AttnPlan(),
        "window+q_scale": AttnPlan(window=7, q_scale=torch.linspace(0.5, 1.5, 24, device=device)),
        "window+sink_tokens": AttnPlan(window=5, sink_tokens=2),
        "sink_logits": AttnPlan(sink_logits=torch.linspace(-1.0, 2.0, n_head, device=device)),
    }[name]


@pytest.mark.parametrize("name,plan,kind", served_cases())
def test_each_devices_queries_over_the_gathered_keys_equal_one_process(name, plan, kind):
    """Every scheme the split serves, under windows, sink tokens, log-n's
    query scales, sink logits and fractional positions: the SDPA path
    (training, gradients to q, k, v and the scheme's parameters) and the
    FlexAttention path (forward; its CPU backward does not exist) equal the
    explicit attention over the whole sequence, on 2 and 3 devices."""
    from tests.test_attention import DIMS, assert_same

    for size in (2, 3):
        got, want = split_against_whole(name, make_plan(plan, DIMS.n_head), kind, "auto", "cpu", DIMS, size=size)
        assert_same(f"{name}/{plan}/{kind}/sdpa/{size}", got, want)
    got, want = split_against_whole(name, make_plan(plan, DIMS.n_head), kind, "flex", "cpu", DIMS, grads=False)
    assert_same(f"{name}/{plan}/{kind}/flex", got, want)


# --- through train.py, as README's scale-up section runs it ----------------------------------------------


def test_two_cpu_ranks_sharing_each_sequence_train_like_one_process_and_resume_on_one(tiny_data_options, tmp_path):
    """trainer.context_parallel=2 on two CPU processes: one data-parallel
    replica whose two devices hold half of each sequence, so the global batch
    is data.batch_size, the one process's; its loss curve and final weights
    are that process's, its checkpoint (gathered) resumes on one process
    without context parallelism, and rank 0 evaluates after training."""
    from test_sharded import SETTINGS, STEPS, assert_ends_like_one_process, curve, data_overrides, finished, train

    batch = tiny_data_options["batch_size"]
    cp = tmp_path / "context"
    # Layers that exercise the served paths: ALiBi biases and RoPE with a window and sink tokens.
    layout = "+model.layout={pattern:[{window:5,sinks:2},{pos:{name:alibi}}]}"
    first = train(
        [
            *data_overrides(tiny_data_options, batch),
            *SETTINGS,
            layout,
            "trainer.context_parallel=2",
            "trainer.devices=2",
            f"trainer.max_steps={STEPS // 2}",
        ],
        cp,
    )
    one = train(
        [
            *data_overrides(tiny_data_options, batch),
            *SETTINGS,
            layout,
            "trainer.devices=1",
            f"trainer.max_steps={STEPS}",
        ],
        tmp_path / "one",
    )
    finished(first)
    with open(cp / "train.log") as f:
        assert "each sequence of 16 tokens split over 2 devices, 8 tokens each" in f.read()
    finished(
        train([f"resume={cp}", f"trainer.max_steps={STEPS}", "trainer.context_parallel=1", "trainer.devices=1"], cp)
    )
    finished(one)

    expected, got = curve(tmp_path / "one"), curve(cp)
    expected, got = [expected[s] for s in sorted(expected)], [got[s] for s in sorted(got)]
    assert len(expected) == len(got) == STEPS, (expected, got)
    assert got == pytest.approx(expected, rel=2e-5), (expected, got)
    assert len({round(v, 4) for v in got}) == STEPS

    assert_ends_like_one_process(cp, tmp_path / "one")


# --- what it refuses, before any work ------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"trainer": {"context_parallel": 3}}, r"data.seq_len=16 is not a multiple of 6\. Use data.seq_len=12 or 18"),
        ({"trainer": {"context_parallel": 0}}, r"trainer.context_parallel=0 must be a positive integer"),
        ({"pos": {"name": "fox"}}, r"positional scheme 'fox'.*computes its attention in a kernel of its own"),
        ({"pos": {"name": "recurrent"}}, r"positional scheme 'recurrent'.*reads the tokens in order"),
        ({"pos": {"name": "deberta"}}, r"positional scheme 'deberta'.*content-position terms"),
        (
            {"model": {"layout": {"pattern": ["rope", {"pos": {"name": "stick_breaking"}}]}}},
            r"'stick_breaking' \(layer 1\)",
        ),
        ({"scaling": {"name": "self_extend"}}, r"extrapolation method 'self_extend'.*second rotary pass"),
        ({"scaling": {"name": "dca"}}, r"extrapolation method 'dca'"),
        ({"pos": {"name": "fire"}}, r"trainer.context_parallel \(FSDP2 on a data x context mesh\) cannot shard"),
        ({"trainer": {"compile": True}}, r"trainer.compile=true is not served with trainer.context_parallel=2"),
        ({"trainer": {"strategy": "ddp"}}, r"trainer.strategy='ddp' cannot be used with it"),
    ],
)
def test_what_context_parallelism_cannot_serve_is_one_paragraph_before_any_work(tiny_config, settings, message):
    from rope_lm.runs.config import resolve_run

    tiny_config["trainer"]["context_parallel"] = 2
    for key, value in settings.items():
        tiny_config.setdefault(key, {})
        if key == "pos" or key == "scaling":
            tiny_config[key] = value
        else:
            tiny_config[key].update(value)
    with pytest.raises(ConfigError, match=message) as caught:
        resolve_run(tiny_config)
    assert "\n" not in str(caught.value)


def test_devices_that_the_context_groups_cannot_divide_are_refused_before_work(tiny_config, tmp_path):
    from rope_lm.runs.config import resolve_run
    from rope_lm.train.trainer import build_trainer, trainer_kwargs

    tiny_config["trainer"].update(context_parallel=2, accelerator="cpu", devices=3)
    run = resolve_run(tiny_config)
    with pytest.raises(ConfigError, match=r"3 device\(s\) on 1 node\(s\).*which 2 does not divide"):
        build_trainer(trainer_kwargs(run.trainer, str(tmp_path), None))


def test_served_schemes_and_methods_pass_the_check(tiny_config):
    from rope_lm.runs.config import resolve_run

    for pos, scaling in [("rope", "yarn"), ("alibi", "none"), ("t5", "none"), ("xpos", "none"), ("rope", "pi")]:
        config = {**tiny_config, "pos": {"name": pos}, "scaling": {"name": scaling}}
        config["trainer"] = {**tiny_config["trainer"], "context_parallel": 2}
        resolve_run(config)


def test_two_replicas_of_two_devices_train_the_global_batch_of_one_process(tiny_data_options, tmp_path):
    """The 2-D mesh: 4 CPU processes, 2 data-parallel replicas (each its own half of the batch)
    of 2 devices sharing each sequence, train the curve of one process with the whole batch."""
    from test_sharded import SETTINGS, curve, data_overrides, finished, train

    batch = tiny_data_options["batch_size"]
    steps = 4
    four = train(
        [
            *data_overrides(tiny_data_options, batch // 2),
            *SETTINGS,
            "trainer.context_parallel=2",
            "trainer.devices=4",
            f"trainer.max_steps={steps}",
        ],
        tmp_path / "four",
    )
    one = train(
        [*data_overrides(tiny_data_options, batch), *SETTINGS, "trainer.devices=1", f"trainer.max_steps={steps}"],
        tmp_path / "one",
    )
    finished(four)
    finished(one)
    expected, got = curve(tmp_path / "one"), curve(tmp_path / "four")
    assert sorted(got) == sorted(expected) and len(got) == steps
    assert [got[s] for s in sorted(got)] == pytest.approx([expected[s] for s in sorted(expected)], rel=2e-5)
