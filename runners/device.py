"""Where a model runs: its device, and waiting for it before a clock is read."""
import torch
from torch.nn import Module


def model_device(model: Module) -> torch.device:
    """Device of the model's first parameters (where its inputs go, also with an accelerate device map)."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


def synchronize(model: Module) -> None:
    """Wait for the model's device, so that a clock read after it counts all the work."""
    device = model_device(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
