"""What a tensor row's attribute reads would cost through ATen (a torch C++ extension) instead of Python getters.

Run from the repository root (``. .venv/bin/activate`` first; needs a C++ compiler and ninja)::

    python benchmarks/bench_aten_getters.py            # builds a throwaway extension (about a minute), then times

Why: every tensor row reads about ten attributes of its tensor (dtype, shape, numel, contiguity, data pointer,
requires_grad, version, device, the negative bit, layout). msprobe_nb's C row builder reads them through the
Python C API, each one a call into torch's getter with its error handler and torch-function check. A torch C++
extension could read them from ``at::Tensor`` directly, but it must be compiled against the installed torch,
which pip's isolated build cannot do without torch as a build requirement (an unpinned download). This script
measures what that decision would buy, so it can be made on numbers: it compiles a small extension into a
temporary folder (``torch.utils.cpp_extension.load_inline``; nothing is kept) and times, per tensor:

* ``python getters``: the ten reads as Python attribute and method calls (what the C API calls amount to);
* ``aten, as row fields``: the same reads in C++, returned as the Python objects a row holds (through a
  pybind11 call, which adds its own overhead: a row builder would call no binding per tensor);
* ``aten, reads only``: the reads alone, in a C++ loop over the tensors.

Best of 5 repeats of 5 passes over 2,000 tensors of shape (4, 16, 32) that require grad.
"""
from __future__ import annotations

import argparse
import tempfile
import timeit

import torch

_SOURCE = r"""
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/ATen.h>

static PyObject *row_fields(PyObject *t_obj) {
    if (!THPVariable_Check(t_obj)) { PyErr_SetString(PyExc_TypeError, "not a tensor"); return NULL; }
    const at::Tensor &t = THPVariable_Unpack(t_obj);
    auto sizes = t.sizes();
    PyObject *shape = PyTuple_New((Py_ssize_t)sizes.size());
    if (shape == NULL) return NULL;
    for (size_t i = 0; i < sizes.size(); i++) PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(sizes[i]));
    long long ptr = t.is_cpu() && t.has_storage() ? (long long)(intptr_t)t.data_ptr() : 0;
    return Py_BuildValue("(iNLOLOLOOi)", (int)t.scalar_type(), shape, (long long)t.numel(),
                         t.is_contiguous() ? Py_True : Py_False, ptr, t.requires_grad() ? Py_True : Py_False,
                         (long long)t._version(), t.is_cpu() ? Py_True : Py_False, t.is_neg() ? Py_True : Py_False,
                         (int)t.layout());
}

py::object fields_of(py::object t) {
    PyObject *r = row_fields(t.ptr());
    if (!r) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(r);
}

long long reads_only(py::list ts) {
    long long acc = 0;
    for (auto item : ts) {
        const at::Tensor &t = THPVariable_Unpack(item.ptr());
        acc += t.numel() + (int)t.scalar_type() + t.is_contiguous() + t.requires_grad() + t._version() + t.is_cpu()
               + t.is_neg() + (int)t.layout() + ((intptr_t)t.data_ptr() & 1);
        for (auto s : t.sizes()) acc += s;
    }
    return acc;
}
"""


def _python_fields(t: torch.Tensor) -> tuple:
    return (t.dtype, tuple(t.shape), t.numel(), t.is_contiguous(), t.data_ptr(), t.requires_grad, t._version,
            t.is_cpu, t.is_neg(), t.layout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tensors", type=int, default=2000)
    args = p.parse_args()
    from torch.utils.cpp_extension import load_inline

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as build:
        ext = load_inline("msprobe_nb_aten_getters_probe", cpp_sources=_SOURCE, functions=["fields_of", "reads_only"],
                          build_directory=build, extra_cflags=["-O2"], verbose=False)
        ts = [torch.randn(4, 16, 32, requires_grad=True) * 1 for _ in range(args.tensors)]
        assert ext.fields_of(ts[0])[1] == tuple(ts[0].shape)
        arms = (("python getters", lambda: [_python_fields(t) for t in ts]),
                ("aten, as row fields", lambda: [ext.fields_of(t) for t in ts]),
                ("aten, reads only", lambda: ext.reads_only(ts)))
        got = {}
        for label, fn in arms:
            got[label] = min(timeit.repeat(fn, number=5, repeat=5)) / 5 / len(ts)
            print(f"{label:22s} {got[label] * 1e9:7.0f} ns a tensor")
        base = got["python getters"]
        print(f"python getters / aten as row fields: {base / got['aten, as row fields']:.1f}x; "
              f"/ aten reads only: {base / got['aten, reads only']:.0f}x")


if __name__ == "__main__":
    main()
