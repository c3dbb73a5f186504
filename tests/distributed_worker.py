"""Two-process training on loopback (gloo), for tests/test_distributed.py.

``python tests/distributed_worker.py MODE OUT`` with MODE ``ddp`` or ``fsdp``: spawns two
ranks that each train one step on half of a fixed batch, at 32 and at 8 bits, and rank 0
saves the averaged loss, the full gradients and both ranks' noise keys to OUT.
"""

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import gact_fx


def model_fn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 10))


def data():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(64, 64, generator=generator), torch.randint(0, 10, (64,), generator=generator)


def wrap(model, mode, backend):
    """The recipes of the README."""
    if mode == "ddp":  # DDPOptimizer splits the compiled graph at DDP's buckets; gact compresses each piece
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(torch.compile(model, backend=backend), bucket_cap_mb=1)
    from torch.distributed.fsdp import fully_shard  # FSDP2: compile each block, then shard

    blocks = [torch.compile(layer, backend=backend) for layer in model]
    for block in blocks:
        if any(p.requires_grad for p in block.parameters()):
            fully_shard(block)
    return fully_shard(nn.Sequential(*blocks))


def worker(rank, mode, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x, y = data()
    results = {}
    for bits in (32, 8):
        gact_fx.manual_seed(0)
        model = model_fn()
        backend = gact_fx.backend(bits=bits, min_numel=0)
        wrapped = wrap(model, mode, backend)  # held until after backward: DDP's reducer all-reduces there
        loss = nn.functional.cross_entropy(wrapped(x.chunk(2)[rank]), y.chunk(2)[rank])
        loss.backward()
        grads = [(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).flatten() for p in model.parameters()]
        average = loss.detach().clone()
        dist.all_reduce(average)
        keys = [None, None]  # each rank's sites' noise keys
        mine = [int(state[0]) for site in backend.registry.sites.values() for state in site._states.values()]
        dist.all_gather_object(keys, mine)
        results[bits] = {"loss": average / 2, "grad": torch.cat(grads), "graphs": len(backend.records),
                         "compressed": backend.report().num_compressed, "keys": keys}
        torch._dynamo.reset()
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    mp.spawn(worker, args=(mode, free_port(), out), nprocs=2)
