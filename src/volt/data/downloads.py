"""One clear error for a data set that is neither on disk nor downloadable."""

from collections.abc import Callable, Sequence
from pathlib import Path


class DataNotFoundError(FileNotFoundError):
    pass


def ensure_files(
    name: str,
    root: Path,
    folder: Path,
    files: Sequence[str],
    download: bool,
    fetch: Callable[[], object],
) -> None:
    """Make sure `folder` holds `files`: fetch them if allowed, else say what to put where."""

    def present() -> bool:
        return all((folder / f).is_file() for f in files)

    if present():
        return
    where = f"put {', '.join(files)} in {folder}"
    if not download:
        raise DataNotFoundError(
            f"data.root={root}: {name} files not found; {where}, or set data.download=true"
        )
    try:
        fetch()
    except Exception as error:  # the network is the usual cause: say what to do offline
        raise DataNotFoundError(
            f"data.root={root}: {name} files not found and the download failed "
            f"({type(error).__name__}: {error}); {where}, or run once with network access"
        ) from error
    if not present():
        raise DataNotFoundError(
            f"data.root={root}: the {name} download did not produce them; {where}"
        )
