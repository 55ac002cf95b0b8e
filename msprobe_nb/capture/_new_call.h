/* Making the recorder's Call (capture/calls.py: a dataclass with __slots__) from C without running its Python
 * __init__: the object is allocated and each field is stored at its slot, the trailing ones from __init__'s
 * defaults. A recorded step makes one Call per recorded call (several hundred), and the generated __init__'s
 * frame and twelve stores cost several times the allocation.
 *
 * This is what the dataclass's __init__ does, and only where the class is such a dataclass: a heap type right
 * under object, no __post_init__, a plain __init__ named <class>.__init__ whose positional parameters are
 * exactly the class's writable object slots, in order. Anything else (a subclass, a patched __init__, another
 * signature) and any call with another number of arguments goes through the type's own call. What was read is
 * cached with the type's version tag, which CPython renews when the class or a base changes.
 */
#ifndef MSPROBE_NB_NEW_CALL_H
#define MSPROBE_NB_NEW_CALL_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_slot_attrs.h"

#define NEW_CALL_MAX_FIELDS 32

typedef struct {
    PyTypeObject *type; /* borrowed: a type freed and another made at its address has another version tag */
    unsigned int tag;
    int usable;         /* 1: fields stored at their slots; 0: the type's own call */
    Py_ssize_t nfields, nrequired;
    Py_ssize_t offsets[NEW_CALL_MAX_FIELDS];
    PyObject *defaults; /* __init__.__defaults__ when usable (a strong reference) */
} CallLayout;

static CallLayout new_call_layout;

/* Read t's layout into L (usable or not): 0, or -1 with an exception set. */
static int new_call_read(PyTypeObject *t, CallLayout *L)
{
    L->usable = 0;
    Py_CLEAR(L->defaults);
    if (!PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE) || t->tp_base != &PyBaseObject_Type
        || t->tp_new != PyBaseObject_Type.tp_new || t->tp_dictoffset != 0)
        return 0;
    PyObject *post = PyUnicode_InternFromString("__post_init__"), *init_name = PyUnicode_InternFromString("__init__");
    if (post == NULL || init_name == NULL) {
        Py_XDECREF(post);
        Py_XDECREF(init_name);
        return -1;
    }
    PyObject *has_post = _PyType_Lookup(t, post), *init = _PyType_Lookup(t, init_name); /* borrowed */
    Py_DECREF(post);
    Py_DECREF(init_name);
    if (has_post != NULL || init == NULL || !PyFunction_Check(init))
        return 0;
    PyObject *qual = ((PyFunctionObject *)init)->func_qualname;
    PyObject *want = PyUnicode_FromFormat("%U.__init__", ((PyHeapTypeObject *)t)->ht_qualname);
    if (want == NULL)
        return -1;
    int same = qual != NULL && PyUnicode_Check(qual) && PyUnicode_Compare(qual, want) == 0;
    Py_DECREF(want);
    if (!same)
        return 0;
    PyCodeObject *code = (PyCodeObject *)PyFunction_GET_CODE(init);
    if (code->co_kwonlyargcount != 0 || (code->co_flags & (CO_VARARGS | CO_VARKEYWORDS)))
        return 0;
    Py_ssize_t n = code->co_argcount - 1, nslots = 0;
    if (n < 1 || n > NEW_CALL_MAX_FIELDS)
        return 0;
    for (PyMemberDef *m = t->tp_members; m != NULL && m->name != NULL; m++)
        nslots++;
    if (nslots != n)
        return 0;
    PyObject *names = PyCode_GetVarnames(code);
    if (names == NULL)
        return -1;
    int ok = PyTuple_Check(names) && PyTuple_GET_SIZE(names) > n;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        PyObject *d = _PyType_Lookup(t, PyTuple_GET_ITEM(names, i + 1));
        L->offsets[i] = member_offset(d);
        ok = L->offsets[i] >= 0 && PyDescr_TYPE(d) == t; /* a slot of t itself */
    }
    Py_DECREF(names);
    PyObject *defaults = PyFunction_GET_DEFAULTS(init); /* borrowed, NULL when there are none */
    Py_ssize_t nd = defaults != NULL ? PyTuple_GET_SIZE(defaults) : 0;
    if (!ok || nd > n)
        return 0;
    L->defaults = defaults != NULL ? Py_NewRef(defaults) : PyTuple_New(0);
    if (L->defaults == NULL)
        return -1;
    L->nfields = n;
    L->nrequired = n - nd;
    L->usable = 1;
    return 0;
}

/* type(*argv): a new reference, NULL on error. */
static PyObject *new_call(PyObject *type, PyObject *const *argv, Py_ssize_t nargs)
{
    if (!PyType_Check(type))
        return PyObject_Vectorcall(type, argv, nargs, NULL);
    PyTypeObject *t = (PyTypeObject *)type;
    CallLayout *L = &new_call_layout;
    if (!(L->type == t && PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG) && L->tag == t->tp_version_tag)) {
        if (new_call_read(t, L) < 0)
            return NULL;
        if (!PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG)) { /* nothing to key a cache on: the type's call */
            L->type = NULL;
            return PyObject_Vectorcall(type, argv, nargs, NULL);
        }
        L->type = t;
        L->tag = t->tp_version_tag;
    }
    if (!L->usable || nargs < L->nrequired || nargs > L->nfields)
        return PyObject_Vectorcall(type, argv, nargs, NULL);
    PyObject *obj = t->tp_alloc(t, 0);
    if (obj == NULL)
        return NULL;
    Py_ssize_t first_default = L->nfields - PyTuple_GET_SIZE(L->defaults);
    for (Py_ssize_t i = 0; i < L->nfields; i++) {
        PyObject *v = i < nargs ? argv[i] : PyTuple_GET_ITEM(L->defaults, i - first_default);
        *(PyObject **)((char *)obj + L->offsets[i]) = Py_NewRef(v);
    }
    return obj;
}

#endif
