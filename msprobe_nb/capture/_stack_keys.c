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

/* The key of frame's stack: up to depth (instruction offset, id(code)) pairs, as native uint64 bytes. */
static PyObject *make_key(PyFrameObject *frame, Py_ssize_t depth)
{
    uint64_t items[2 * 256];
    Py_ssize_t k = 0;
    if (depth > 256)
        depth = 256;
    PyFrameObject *f = frame;
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
    return make_key((PyFrameObject *)frame, depth);
}

/* StackTable.stack_id and walked_id in C, over the table's own state (its dicts and last frame, read and written
   as its attributes, so the Python methods and these share them): a recorded call's stack id without a Python
   frame of its own. */
typedef struct {
    PyObject_HEAD
    PyObject *table;
    Py_ssize_t depth;
} Ids;

static PyObject *s_enabled, *s_stack_ids, *s_new_stack, *s_last_frame, *s_last_frame_sids;

/* 1 when the call has no stack id (-1): stacks are off or there is no frame; 0 when it has one; -1 on error. */
static int no_stack(Ids *ids, PyObject *frame)
{
    if (frame == Py_None)
        return 1;
    PyObject *on = PyObject_GetAttr(ids->table, s_enabled);
    int enabled = on != NULL ? PyObject_IsTrue(on) : -1;
    Py_XDECREF(on);
    if (enabled <= 0)
        return enabled < 0 ? -1 : 1;
    if (!PyFrame_Check(frame)) {
        PyErr_SetString(PyExc_TypeError, "a stack id needs a frame or None");
        return -1;
    }
    return 0;
}

static PyObject *walk_id(Ids *ids, PyObject *frame)
{
    PyObject *key = make_key((PyFrameObject *)frame, ids->depth);
    PyObject *known = key != NULL ? PyObject_GetAttr(ids->table, s_stack_ids) : NULL;
    PyObject *sid = NULL;
    if (known != NULL) {
        if (!PyDict_Check(known)) {
            PyErr_SetString(PyExc_TypeError, "StackTable._stack_ids must be a dict");
        } else if ((sid = PyDict_GetItemWithError(known, key)) != NULL) {
            Py_INCREF(sid);
        } else if (!PyErr_Occurred()) {
            sid = PyObject_CallMethodOneArg(ids->table, s_new_stack, frame);
            if (sid != NULL && PyDict_SetItem(known, key, sid) < 0)
                Py_CLEAR(sid);
        }
    }
    Py_XDECREF(key);
    Py_XDECREF(known);
    return sid;
}

static PyObject *Ids_walked_id(Ids *ids, PyObject *frame)
{
    int none = no_stack(ids, frame);
    return none ? (none < 0 ? NULL : PyLong_FromLong(-1)) : walk_id(ids, frame);
}

#define RESUMABLE (CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR)

static PyObject *Ids_stack_id(Ids *ids, PyObject *frame)
{
    int none = no_stack(ids, frame);
    if (none)
        return none < 0 ? NULL : PyLong_FromLong(-1);
    PyObject *table = ids->table, *lasti = NULL, *sids = NULL, *sid = NULL;
    PyObject *last = PyObject_GetAttr(table, s_last_frame);
    if (last == NULL)
        return NULL;
    if (last == frame) { /* another call from the frame of the last one: same ancestors */
        lasti = PyLong_FromLong(PyFrame_GetLasti((PyFrameObject *)frame));
        sids = lasti != NULL ? PyObject_GetAttr(table, s_last_frame_sids) : NULL;
        if (sids == NULL)
            goto done;
        if (!PyDict_Check(sids)) {
            PyErr_SetString(PyExc_TypeError, "StackTable._last_frame_sids must be a dict");
            goto done;
        }
        sid = PyDict_GetItemWithError(sids, lasti);
        if (sid != NULL || PyErr_Occurred()) {
            Py_XINCREF(sid);
            goto done;
        }
        Py_CLEAR(sids);
    } else {
        PyCodeObject *code = PyFrame_GetCode((PyFrameObject *)frame);
        int resumable = (code->co_flags & RESUMABLE) != 0;
        Py_DECREF(code);
        if (resumable) { /* a generator is resumed from anywhere: no shortcut */
            if (PyObject_SetAttr(table, s_last_frame, Py_None) < 0)
                goto done;
        } else {
            PyObject *fresh = PyDict_New();
            int bad = fresh == NULL || PyObject_SetAttr(table, s_last_frame, frame) < 0
                      || PyObject_SetAttr(table, s_last_frame_sids, fresh) < 0;
            Py_XDECREF(fresh);
            if (bad)
                goto done;
        }
    }
    sid = walk_id(ids, frame);
    if (sid == NULL)
        goto done;
    Py_DECREF(last);
    last = PyObject_GetAttr(table, s_last_frame);
    if (last == NULL) {
        Py_CLEAR(sid);
        goto done;
    }
    if (last == frame) {
        if (lasti == NULL)
            lasti = PyLong_FromLong(PyFrame_GetLasti((PyFrameObject *)frame));
        sids = lasti != NULL ? PyObject_GetAttr(table, s_last_frame_sids) : NULL;
        if (sids == NULL || PyObject_SetItem(sids, lasti, sid) < 0)
            Py_CLEAR(sid);
    }
done:
    Py_XDECREF(last);
    Py_XDECREF(lasti);
    Py_XDECREF(sids);
    return sid;
}

static PyObject *Ids_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *table;
    Py_ssize_t depth;
    if ((kw != NULL && PyDict_GET_SIZE(kw)) || !PyArg_ParseTuple(args, "On", &table, &depth))
        return NULL;
    Ids *ids = (Ids *)type->tp_alloc(type, 0);
    if (ids != NULL) {
        ids->table = Py_NewRef(table);
        ids->depth = depth;
    }
    return (PyObject *)ids;
}

static int Ids_traverse(Ids *ids, visitproc visit, void *arg)
{
    Py_VISIT(ids->table);
    return 0;
}

static int Ids_clear(Ids *ids)
{
    Py_CLEAR(ids->table);
    return 0;
}

static void Ids_dealloc(Ids *ids)
{
    PyObject_GC_UnTrack(ids);
    Ids_clear(ids);
    Py_TYPE(ids)->tp_free((PyObject *)ids);
}

static PyObject *Ids_stack_id_checked(Ids *ids, PyObject *frame)
{
    if (ids->table == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Ids: cleared");
        return NULL;
    }
    return Ids_stack_id(ids, frame);
}

static PyObject *Ids_walked_id_checked(Ids *ids, PyObject *frame)
{
    if (ids->table == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Ids: cleared");
        return NULL;
    }
    return Ids_walked_id(ids, frame);
}

static PyMethodDef Ids_methods[] = {
    {"stack_id", (PyCFunction)Ids_stack_id_checked, METH_O, "StackTable.stack_id(frame), in C."},
    {"walked_id", (PyCFunction)Ids_walked_id_checked, METH_O, "StackTable.walked_id(frame), in C."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject IdsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_nb.capture._stack_keys.Ids",
    .tp_basicsize = sizeof(Ids),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Ids(table, depth): a StackTable's stack_id and walked_id in C, over the table's own state.",
    .tp_new = Ids_new,
    .tp_traverse = (traverseproc)Ids_traverse,
    .tp_clear = (inquiry)Ids_clear,
    .tp_dealloc = (destructor)Ids_dealloc,
    .tp_methods = Ids_methods,
};

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
    if ((s_enabled = PyUnicode_InternFromString("enabled")) == NULL
        || (s_stack_ids = PyUnicode_InternFromString("_stack_ids")) == NULL
        || (s_new_stack = PyUnicode_InternFromString("_new_stack")) == NULL
        || (s_last_frame = PyUnicode_InternFromString("_last_frame")) == NULL
        || (s_last_frame_sids = PyUnicode_InternFromString("_last_frame_sids")) == NULL || PyType_Ready(&IdsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "ABI", STACK_KEYS_ABI) < 0
                      || PyModule_AddObjectRef(m, "Ids", (PyObject *)&IdsType) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
