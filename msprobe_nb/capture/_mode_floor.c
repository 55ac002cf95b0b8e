/* The floor of a torch function mode: handlers that only call the function, in C.
 *
 * benchmarks/bench_mode_floor.py measures what torch's mode dispatch costs per call with a handler that does
 * nothing, to set how far the recorder's own handler is from that floor. torch calls the mode's
 * __torch_function__ with (func, types, args, kwargs) and requires it to be bound to the mode (its __self__
 * must be the mode), so both shapes take the mode first:
 *   passthrough            a C function, bound to a mode with types.MethodType (an instance attribute)
 *   Passthrough()          an instance of a C type, a class attribute: a descriptor that binds itself to the
 *                          mode (a method object over it), and whose tp_call does the same as passthrough
 * Plain C over the CPython API; nothing here is compiled against torch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* args: (mode, func, types, args[, kwargs]) */
static PyObject *call_func(PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "passthrough(mode, func, types, args, kwargs=None)");
        return NULL;
    }
    PyObject *func = args[1], *fargs = args[3];
    PyObject *kwargs = nargs == 5 ? args[4] : Py_None;
    if (!PyTuple_Check(fargs)) {
        PyErr_SetString(PyExc_TypeError, "passthrough: args must be a tuple");
        return NULL;
    }
    if (kwargs == Py_None || (PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs) == 0)) {
        return PyObject_Call(func, fargs, NULL);
    }
    if (!PyDict_Check(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "passthrough: kwargs must be a dict or None");
        return NULL;
    }
    return PyObject_Call(func, fargs, kwargs);
}

static PyObject *passthrough(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    return call_func(args, nargs);
}

typedef struct {
    PyObject_HEAD
} Passthrough;

static PyObject *Passthrough_call(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kw) {
    if (kw != NULL && PyDict_GET_SIZE(kw) != 0) {
        PyErr_SetString(PyExc_TypeError, "Passthrough() takes positional arguments only");
        return NULL;
    }
    return call_func(&PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args));
}

static PyObject *Passthrough_get(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type)) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyTypeObject PassthroughType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_nb.capture._mode_floor.Passthrough",
    .tp_basicsize = sizeof(Passthrough),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An empty mode handler as a class attribute: binds to the mode, calls func(*args, **kwargs).",
    .tp_call = Passthrough_call,
    .tp_descr_get = Passthrough_get,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"passthrough", (PyCFunction)(void (*)(void))passthrough, METH_FASTCALL,
     "passthrough(mode, func, types, args, kwargs=None): func(*args, **kwargs), an empty mode handler."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mode_floor",
                                    "Empty torch function mode handlers in C (the floor of mode dispatch).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__mode_floor(void) {
    if (PyType_Ready(&PassthroughType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&PassthroughType);
    if (PyModule_AddObject(m, "Passthrough", (PyObject *)&PassthroughType) < 0) {
        Py_DECREF(&PassthroughType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
