"""What every benchmark script shares: running in the project's virtualenv, and loading the
other scripts as modules, so that their data, database and machine helpers are reused rather
than copied. A script starts with::

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
    from benchlib import ROOT, reexec_in_venv, script_module  # noqa: E402
    reexec_in_venv(__file__)

(``Path(__file__).resolve().parent`` for the scripts directly in ``bench/``.)
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
VENV_PYTHON = VENV / "bin" / "python"


def reexec_in_venv(script: str) -> None:
    """Run the script again with the virtualenv's Python, unless it already runs there (or
    there is none): ``python3 bench/x`` works as well as ``.venv/bin/python bench/x``. A
    ``__main__.py`` is started as its folder, as it was."""
    if Path(sys.prefix).resolve() == VENV.resolve() or not VENV_PYTHON.exists() \
            or os.environ.get("HINDSIGHT_BENCH_REEXEC"):
        return
    os.environ["HINDSIGHT_BENCH_REEXEC"] = "1"
    path = Path(script).resolve()
    target = path.parent if path.name == "__main__.py" else path
    os.execv(VENV_PYTHON, [str(VENV_PYTHON), str(target), *sys.argv[1:]])


def script_module(name: str, path: Path) -> ModuleType:
    """A benchmark script as a module (``bench/ingest`` has no suffix, ``bench/figure`` is a
    ``__main__``), loaded once under ``name``."""
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look themselves up there
    loader.exec_module(module)
    return module
