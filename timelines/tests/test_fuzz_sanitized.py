"""The C scanner of audit logs under AddressSanitizer and UndefinedBehaviorSanitizer: built by
``scripts/sanitize.sh`` into a temporary directory, then fed every input of the C scanner's fuzz
test (``test_fuzz_audit``, the same 10,000 generated logs, still held equal to the Python
parser) in a Python of its own that preloads the ASan runtime. Any sanitizer report fails.

The second test proves the harness can fail: an extension with a deliberate heap overflow and
one with signed overflow, built and run the same way, must be reported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer")


def build(out: Path, *source: str) -> tuple[str, str]:
    """``scripts/sanitize.sh``: the sanitized module's path and the ASan runtime to preload."""
    done = subprocess.run([str(ROOT / "scripts" / "sanitize.sh"), str(out), *source],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    module, runtime = done.stdout.split()[-2:]
    return module, runtime


def sanitized_env(runtime: str, **extra: str) -> dict[str, str]:
    """The environment of a Python importing a sanitized build: the ASan runtime preloaded.
    CPython frees little at exit, so leaks are not looked for; a finding ends the process with
    its report on stderr and the exit code 86 (ASan) or 87 (UBSan)."""
    env = dict(os.environ, LD_PRELOAD=runtime, **extra)
    env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:exitcode=86"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1:exitcode=87"
    return env


def findings(done: subprocess.CompletedProcess) -> list[str]:
    """The sanitizers' report lines in a finished process's output."""
    return [line for line in (done.stderr + done.stdout).splitlines()
            if any(report in line for report in REPORTS)]


def test_the_fuzzed_inputs_give_no_sanitizer_report_and_the_python_parser_s_rows(tmp_path):
    module, runtime = build(tmp_path / "build")
    done = subprocess.run(
        # -s: pytest's capture of stderr would swallow a report written as the process ends
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", "-s",
         "timelines/tests/test_fuzz_audit.py", "-k", "c_scanner"],
        capture_output=True, text=True, cwd=ROOT, timeout=1800,
        env=sanitized_env(runtime, HINDSIGHT_AUDITSCAN=module))
    assert findings(done) == [], done.stderr[-6000:]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "2 passed" in done.stdout


BAD = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>

static PyObject *overflow(PyObject *self, PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    char *p = malloc(8);
    memset(p, 0, (size_t)n);  /* n = 9: one past the end */
    int got = p[0];
    free(p);
    return PyLong_FromLong(got);
}

static PyObject *signed_overflow(PyObject *self, PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    return PyLong_FromLong(n + INT_MAX);
}

static PyMethodDef methods[] = {
    {"overflow", overflow, METH_VARARGS, ""},
    {"signed_overflow", signed_overflow, METH_VARARGS, ""},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_bad", NULL, -1, methods};
PyMODINIT_FUNC PyInit__bad(void) { return PyModule_Create(&module); }
"""


@pytest.mark.parametrize(("call", "report"), [("overflow(9)", "heap-buffer-overflow"),
                                              ("signed_overflow(1)", "signed integer overflow")])
def test_the_harness_reports_what_the_sanitizers_find(tmp_path, call, report):
    source = tmp_path / "bad.c"
    source.write_text(BAD)
    module, runtime = build(tmp_path / "build", str(source), "_bad")
    script = ("import importlib.util as u; s = u.spec_from_file_location('_bad', "
              f"{module!r}); m = u.module_from_spec(s); s.loader.exec_module(m); m.{call}")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=sanitized_env(runtime), timeout=120)
    assert done.returncode in (86, 87)
    assert findings(done) and report in done.stderr, done.stderr[-2000:]
