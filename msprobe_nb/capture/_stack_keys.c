/* The key of a call's stack: (instruction offset, id(code)) of every frame from a frame up, in C.
 *
 * Why: every recorded call that does not come from the frame of the last one walks its whole stack to
 * find its deduplicated stack id (Recorder.stack_id); in Python that walk is ~3 µs for a 20-frame stack.
 * The key is a bytes object of native 64-bit pairs, not a tuple of ints: looking a key up compares it with
 * the stored one, and a tuple's int objects lie scattered in memory (a cache miss each), where bytes are
 * one memcmp. The key is exactly the bytes the Python walk builds, so the two are interchangeable (and
 * tested against each other).
 *
 * Needs CPython 3.11+ (PyFrame_GetLasti); setup.py builds it as an optional extension, and without it
 * the Python walk runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>

#if PY_VERSION_HEX < 0x030B0000
#error "_stack_keys needs CPython 3.11 or later"
#endif

static PyObject *stack_key(PyObject *self, PyObject *args)
{
    PyObject *frame;
    Py_ssize_t depth;
    (void)self;
    if (!PyArg_ParseTuple(args, "On", &frame, &depth))
        return NULL;
    if (!PyFrame_Check(frame)) {
        PyErr_SetString(PyExc_TypeError, "stack_key() needs a frame");
        return NULL;
    }
    uint64_t items[2 * 256];
    Py_ssize_t k = 0;
    if (depth > 256)
        depth = 256;
    PyFrameObject *f = (PyFrameObject *)frame;
    Py_INCREF(f);
    while (f != NULL && depth > 0) {
        PyCodeObject *code = PyFrame_GetCode(f);  /* new reference */
        items[k] = (uint64_t)(int64_t)PyFrame_GetLasti(f);
        items[k + 1] = (uint64_t)(uintptr_t)code;  /* id(code) */
        Py_DECREF(code);
        k += 2;
        PyFrameObject *back = PyFrame_GetBack(f);  /* new reference or NULL */
        Py_DECREF(f);
        f = back;
        depth--;
    }
    Py_XDECREF(f);
    return PyBytes_FromStringAndSize((const char *)items, k * (Py_ssize_t)sizeof(uint64_t));
}

static PyMethodDef methods[] = {
    {"stack_key", stack_key, METH_VARARGS,
     "stack_key(frame, depth) -> bytes of native uint64 (f_lasti, id(f_code)) pairs for frame and up to depth - 1 "
     "of its callers."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_stack_keys",
                                    "Stack keys of frames for Recorder.stack_id.", -1, methods,
                                    NULL, NULL, NULL, NULL};

/* Raise with capture/c_contract.py's STACK_KEYS_ABI whenever stack_key's arguments or its bytes change. */
#define STACK_KEYS_ABI 1

PyMODINIT_FUNC PyInit__stack_keys(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", STACK_KEYS_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
