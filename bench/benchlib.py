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
import json
import os
import shutil
import sys
import time
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


OUT_DIR = ROOT / "bench" / "out"
SYNTHETIC = ("synthetic: the figure benchmark's incident (fixture requests cloned with new "
             "auditIDs, times, names)")


def incident_arguments(parser, *, database_url: str, runs: int, runs_help: str) -> None:
    """The arguments of a benchmark on the figure benchmark's synthetic incident."""
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--objects", type=int, default=300)
    parser.add_argument("--runs", type=int, default=runs, help=f"{runs_help} (default {runs})")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the incident built by the previous run, do not rebuild")
    parser.add_argument("--database-url", default=database_url,
                        help="PostgreSQL database to DROP and recreate (its name must contain "
                             f"'bench'; default {database_url})")
    parser.add_argument("--seed", type=int, default=1)


def synthetic_incident(args, columns_dir: Path):
    """(bench/ingest, bench/figure as modules, the incident's id, the results so far): the
    figure benchmark's synthetic incident of ``args.events`` built into ``args.database_url``
    (dropped and recreated; a name without "bench" is refused), or with ``--reuse`` the one
    built last time (migrated first). Django is set up with the in-process cache, emptied
    before every cold run without flushing a Redis database that something else may use, and
    ``columns_dir`` (emptied) for column indexes."""
    sys.path.insert(0, str(ROOT / "bench" / "figure"))  # its build.py
    ingest = script_module("bench_ingest", ROOT / "bench" / "ingest")
    figure = script_module("bench_figure", ROOT / "bench" / "figure" / "__main__.py")
    ingest._bench_database(args.database_url)  # refuses a database not named *bench*
    shutil.rmtree(columns_dir, ignore_errors=True)
    figure.setup_django(args.database_url, "", columns_dir)
    results: dict = {"data": SYNTHETIC, "events": args.events, "seed": args.seed}
    if args.reuse:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        incident_id = figure.existing_incident(args.events)
        print(f"reusing incident {incident_id} of {args.database_url}", flush=True)
    else:
        print(f"building {args.events:,} synthetic events in {args.database_url} …", flush=True)
        results["build"] = figure.build_incident(ingest, args)
        incident_id = results["build"]["incident"]
    return ingest, figure, incident_id, results


def write_results(results: dict, name: str, ingest, database_url: str) -> Path:
    """``results`` with the machine, PostgreSQL's version, the load at the end, the code's
    commit and the time, written to ``bench/out/<name>.json``."""
    results["machine"] = {**ingest.machine(), "postgresql": ingest.postgres_version(database_url),
                          "load_average_end": [round(v, 2) for v in os.getloadavg()]}
    results["code"] = ingest.checkout()
    results["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results  {path.relative_to(ROOT)}")
    return path
