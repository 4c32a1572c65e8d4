"""What torchrun's ranks must agree on before Lightning starts: the name of their run directory.

Under `torchrun`, every rank runs `train.py`, so every rank runs Hydra, which names an unnamed
run's directory with `${volt.run_id:${name}}`: start time plus a random tag, different in every
process. Rank 0
therefore publishes its stamp in the store that torchrun's agent already serves at
MASTER_ADDR:MASTER_PORT (the one `init_process_group` joins later), and every other rank, on this
node or on another, waits for it there. One key per restart: a restarted run gets a new directory.
"""

import os
from datetime import timedelta

STAMP_TIMEOUT = timedelta(minutes=2)


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def stamp_of_rank_zero(own_stamp: str) -> str:
    """`own_stamp` in rank 0; in every other rank, the stamp rank 0 published."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise RuntimeError(
            "torchrun started this rank without its agent store (TORCHELASTIC_USE_AGENT_STORE is"
            " not True), so the ranks cannot agree on one run directory; unset"
            " TORCH_DISABLE_SHARE_RDZV_TCP_STORE."
        )
    from torch.distributed import TCPStore

    store = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=STAMP_TIMEOUT,
    )
    key = f"volt/run_stamp/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if int(os.environ["RANK"]) == 0:
        store.set(key, own_stamp)
        return own_stamp
    return store.get(key).decode()
