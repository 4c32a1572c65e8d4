"""Why a checkpoint on disk is not loaded."""


class CheckpointLoadError(RuntimeError):
    """A checkpoint exists but does not load: truncated, damaged, or not a checkpoint."""


class UnsafeCheckpointError(CheckpointLoadError):
    """A sharded checkpoint declares what volt does not read: code, a place outside its folder,
    or more memory than its files hold."""
