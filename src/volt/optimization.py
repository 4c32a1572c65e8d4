"""How volt speeds a model up: torch.compile, applied in one place."""

from torch import nn

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def apply_compile(
    net: nn.Module, mode: str | None, fullgraph: bool = False, dynamic: bool | None = None
) -> None:
    """Compile `net` in place (mode None: leave it eager).

    nn.Module.compile() swaps the module's call for a compiled one without wrapping it, so
    state_dict keys stay free of `_orig_mod.` and checkpoints load with or without compile.
    """
    if mode is None:
        return
    if mode not in COMPILE_MODES:
        raise ValueError(
            f"compile.mode={mode!r} is not valid: use one of {', '.join(COMPILE_MODES)}"
        )
    net.compile(mode=mode, fullgraph=fullgraph, dynamic=dynamic)
