"""benchmarks/ is a folder of scripts, not a package: a test loads one as a module, with the
folder first on sys.path as `python benchmarks/<script>.py` puts it (for `import harness`)."""

import importlib.util
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest

from volt.config import PROJECT_ROOT

BENCHMARKS = PROJECT_ROOT / "benchmarks"


@pytest.fixture(scope="module")
def load_benchmark() -> Iterator[Callable[[str], ModuleType]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))

        def load(name: str) -> ModuleType:
            spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module

        yield load
