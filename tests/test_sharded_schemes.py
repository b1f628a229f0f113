"""rope_lm.train.sharding.shard across positional schemes, on two CPU ranks over
gloo without Lightning: each rank keeps every positional buffer as one
process builds it, and the sharded loss and every gradient (gathered whole)
equal the unsharded model's on the same global batch, for schemes whose
state is buffers (RoPE frequencies, ALiBi slopes) and parameters in the
root unit (T5's bucket table, Kerple's kernel); FIRE, whose scalar
parameters FSDP2 cannot shard, is refused before any work."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from tests import forked

SCHEMES = ["rope", "alibi", "t5", "kerple"]


def _worker(rank, world, port, failures):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from rope_lm.model.transformer import build_model
    from rope_lm.train.lit import TrainingLoss
    from rope_lm.train.sharding import shard

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        idx = torch.randint(0, 97, (2 * world, 33), generator=torch.Generator().manual_seed(5))
        x, y = idx[:, :-1], idx[:, 1:]
        for name in SCHEMES:
            cfg = {"n_layer": 2, "n_head": 4, "d_model": 32, "activation_checkpointing": True}
            torch.manual_seed(0)
            whole = build_model(cfg, {"name": name}, None, 97, 32).train()
            torch.manual_seed(0)
            model = build_model(cfg, {"name": name}, None, 97, 32).train()
            ref = TrainingLoss(whole)(x, y)  # the global batch in one process
            ref.backward()
            loss_fn = TrainingLoss(model)
            shard(loss_fn, model.blocks, mesh, "32-true")
            for (key, buf), (_, expected) in zip(model.named_buffers(), whole.named_buffers()):
                if not torch.equal(buf, expected):
                    failures.put(f"{name}: rank {rank} buffer {key} differs")
            part = slice(2 * rank, 2 * rank + 2)  # this rank's half of the global batch
            loss = loss_fn(x[part], y[part])
            loss.backward()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            if not torch.allclose(mean / world, ref.detach(), rtol=1e-5, atol=1e-6):
                failures.put(f"{name}: loss {float(mean / world)} vs {float(ref)}")
            for (key, p), (_, q) in zip(model.named_parameters(), whole.named_parameters()):
                grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                if not torch.allclose(grad, q.grad, rtol=1e-4, atol=1e-6):
                    failures.put(f"{name}: gradient of {key} differs by {float((grad - q.grad).abs().max())}")
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.filterwarnings("ignore")
def test_sharded_blocks_keep_buffers_and_gradients_for_each_scheme():
    failures = forked.context().Queue()  # also sets the server's preload, which the ranks are forked from
    mp.start_processes(_worker, args=(2, _free_port(), failures), nprocs=2, join=True, start_method="forkserver")
    found = []
    while not failures.empty():
        found.append(failures.get())
    assert not found, "\n".join(found)


def test_a_scheme_with_scalar_parameters_is_refused_before_work(tiny_config):
    from rope_lm.core.errors import ConfigError
    from rope_lm.runs.config import resolve_run

    tiny_config["trainer"].update(sharded=True, devices=2)
    tiny_config["pos"] = {"name": "fire"}
    with pytest.raises(
        ConfigError, match=r"trainer=fsdp cannot shard this model with FSDP2: its parameters pos_scheme.layers.0.c"
    ):
        resolve_run(tiny_config)
