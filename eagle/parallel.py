"""Data-parallel training over several processes, started by ``torchrun`` or ``accelerate launch``
(both set ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``): the
processes join one group (gloo on CPU, nccl on CUDA), each takes its share of every batch, and the
sums of their gradients and counts make each step the step one process takes on the whole batch."""
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Tuple

import torch
from torch import Tensor

# the other processes wait while the first writes data or features (a whole data run, if it must):
# write the data first with --data-only for a long one
WAIT = timedelta(hours=12)


@dataclass(frozen=True)
class World:
    """This process's place among the training processes; ``World()``: alone."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Whether this process writes (data, checkpoints, the head) and speaks."""
        return self.rank == 0

    @property
    def share(self) -> Tuple[int, int]:
        return self.rank, self.size

    def sum(self, tensor: Tensor) -> Tensor:
        """``tensor`` summed over the processes, in place (itself when alone)."""
        if self.size > 1:
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return tensor

    def any(self, flag: bool, device) -> bool:
        """Whether ``flag`` holds in any process (so that all of them decide alike)."""
        if self.size == 1:
            return flag
        return bool(self.sum(torch.tensor([float(flag)], device=device)).item() > 0)

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Every parameter's gradient summed over the processes (one collective; a missing one counts as zero)."""
        if self.size == 1:
            return
        parameters = list(parameters)
        for p in parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = self.sum(torch.cat([p.grad.reshape(-1) for p in parameters]))
        offset = 0
        for p in parameters:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def barrier(self) -> None:
        if self.size > 1:
            torch.distributed.barrier()


def join(device: str) -> Tuple[World, str]:
    """This process's world from the launcher's environment, and its device (``cuda`` becomes
    ``cuda:LOCAL_RANK`` in a group); a group is joined when ``WORLD_SIZE`` is over 1."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World(), device
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        device = f"cuda:{local}"
        torch.cuda.set_device(device)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    torch.distributed.init_process_group(backend, rank=rank, world_size=size, timeout=WAIT)
    return World(rank, size), device


def leave(world: World) -> None:
    if world.size > 1 and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
