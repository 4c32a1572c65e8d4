import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback


class RNGStateInCheckpoint(Callback):
    """Saves the random generators' states with each checkpoint and restores them on resume, so
    dropout and augmentation draw the same numbers as in a run that was never stopped.

    Stored as tensors and plain values (numpy's state as its parts), loadable with weights_only.
    """

    def state_dict(self) -> dict[str, Any]:
        _kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "python": list(random.getstate()[1]),
            "python_gauss": random.getstate()[2],
            "numpy": [torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, gauss],
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        random.setstate((3, tuple(state["python"]), state["python_gauss"]))
        keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
