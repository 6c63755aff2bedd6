"""Parameters sharded by FSDP2 (`torch.distributed.fsdp.fully_shard`): each rank holds a `DTensor` whose local
tensor is its shard. These helpers let the trainers treat sharded and plain parameters alike."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor


def is_sharded(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, DTensor)


def shard_like(full: torch.Tensor, param: DTensor) -> DTensor:
    """`full` (a whole tensor every rank holds, e.g. an initial weight) sharded as `param` is: each rank keeps only
    its part. Local slicing, no communication (`src_data_rank=None`), so every rank must pass the same `full`."""
    if full.is_meta:
        raise ValueError("the initial weights are on the meta device on this rank (FSDP's cpu_ram_efficient_loading "
                         "loads them on rank 0 only): set `fsdp_cpu_ram_efficient_loading: false` for l2_lambda, "
                         "which needs θ₀ on every rank")
    return distribute_tensor(full.to(param.device, param.dtype), param.device_mesh, param.placements,
                             src_data_rank=None)


def sum_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """`value` (a 0-d partial sum over this rank's shards) with the value of the sum over all ranks but the gradient
    of the local term only: every rank then adds the whole penalty to its loss, as under DDP, while each shard
    gets exactly its own gradient. One all-reduce."""
    total = value.detach().clone()
    dist.all_reduce(total)
    return value + (total - value.detach())


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a `DTensor` (an all-gather, differentiable: every rank must call it), or the tensor."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
