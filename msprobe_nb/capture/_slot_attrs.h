/* Reads and writes of an object's __slots__ members straight at their offsets (the Recorder's per-call state,
 * a Call's fields): what PyObject_GetAttr / PyObject_SetAttr do for them, without the type lookup and the
 * descriptor call on every access. A recorded call reads some twenty such attributes.
 *
 * The offset of (type, name) comes from the member descriptor the type's MRO gives for name, and is cached
 * with the type's version tag: CPython gives a type a new tag whenever it or a base changes, so a class that
 * is patched (a property put over a slot, say) is looked up again. Anything that is not a writable object slot
 * (a property, an instance dict entry, a type without a valid tag, an unset slot) takes the generic path, so
 * errors and semantics are PyObject_GetAttr's and PyObject_SetAttr's. A call site names its attribute through
 * SLOT_GET / SLOT_SET, whose cache entry SLOT_CACHE(name) declares once per translation unit.
 */
#ifndef MSPROBE_NB_SLOT_ATTRS_H
#define MSPROBE_NB_SLOT_ATTRS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* What one call site's attribute name resolved to last: the type, its version tag, the slot's offset (-1: the
   generic path). One per name and translation unit (SLOT_CACHE below), so no two names evict each other. */
typedef struct {
    PyTypeObject *type; /* borrowed: a type freed and another made at its address has another version tag */
    unsigned int tag;
    Py_ssize_t offset;
} SlotCache;

#define SLOT_CACHE(name) static SlotCache sc_##name
#define SLOT_GET(obj, name) slot_get((obj), s_##name, &sc_##name)
#define SLOT_SET(obj, name, value) slot_set((obj), s_##name, (value), &sc_##name)

/* The byte offset of the writable object slot a class attribute d describes (a member descriptor), or -1 for
   anything else. */
static inline Py_ssize_t member_offset(PyObject *d)
{
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type))
        return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    return m->type == T_OBJECT_EX && !(m->flags & READONLY) ? m->offset : -1;
}

/* The byte offset of obj's object slot `name`, or -1 where the generic path must be taken. */
static Py_ssize_t slot_offset(PyObject *obj, PyObject *name, SlotCache *e)
{
    PyTypeObject *tp = Py_TYPE(obj);
    if (e->type == tp && PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) && e->tag == tp->tp_version_tag)
        return e->offset;
    Py_ssize_t off = member_offset(_PyType_Lookup(tp, name)); /* the lookup gives the type a version tag where it can */
    if (PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG)) {
        e->type = tp;
        e->tag = tp->tp_version_tag;
        e->offset = off;
    }
    return off;
}

/* obj.<name>: a new reference, NULL with an exception set on error. */
static inline PyObject *slot_get(PyObject *obj, PyObject *name, SlotCache *cache)
{
    Py_ssize_t off = slot_offset(obj, name, cache);
    if (off >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + off);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, name); /* unset slots raise AttributeError there */
}

/* obj.<name> = value (value not NULL): 0, or -1 with an exception set. */
static inline int slot_set(PyObject *obj, PyObject *name, PyObject *value, SlotCache *cache)
{
    Py_ssize_t off = slot_offset(obj, name, cache);
    if (off < 0)
        return PyObject_SetAttr(obj, name, value);
    PyObject **addr = (PyObject **)((char *)obj + off);
    PyObject *old = *addr;
    *addr = Py_NewRef(value);
    Py_XDECREF(old); /* last: its finalizer may run Python code */
    return 0;
}

/* Reads of a C type's computed attributes (getset descriptors: a tensor's dtype, shape, _version...) by calling
 * the descriptor's getter straight away: what PyObject_GetAttr ends in for them (a data descriptor wins over
 * the instance dict), without the generic lookup and the descriptor call on every read. And calls of a C
 * type's method without arguments (a tensor's is_contiguous(), is_neg(), data_ptr()) through the method's C
 * function: what obj.name() ends in, without looking the method up and making the call's vector on every call.
 *
 * The descriptor's function for (type, name) is cached with the type's version tag, as the slots above are, for
 * two types per name (a plain tensor and a parameter take turns in a step; the older entry makes room). A type
 * whose attribute lookup is not the generic one, a name that is no such descriptor of the object's type (a
 * property a subclass put over it), a type without a valid tag, a method with other calling conventions, or an
 * instance attribute of a method's name (which obj.name() would call instead) takes PyObject_GetAttr or
 * PyObject_CallMethodNoArgs itself. */
typedef struct {
    PyTypeObject *type; /* borrowed, as in SlotCache */
    unsigned int tag;
    void (*fn)(void);   /* the getter or the method's C function; NULL: the generic path */
    void *closure;      /* a getter's closure */
    int flags;          /* a method's: METH_NOARGS or METH_VARARGS | METH_KEYWORDS */
} DescrEntry;

typedef struct {
    DescrEntry e[2];
    int next;
} DescrCache;

#define GETSET_CACHE(name) static DescrCache gc_##name
#define GETSET_GET(obj, name) getset_read((obj), s_##name, &gc_##name)
#define METHOD_CACHE(name) static DescrCache mc_##name
#define METHOD_CALL0(obj, name) method_call0((obj), s_##name, &mc_##name)

/* The entry of (tp, name): the one filled before, or a fresh one with no function (*found: the descriptor of
   type kind the type's MRO gives for name, with which the caller fills it, or NULL); NULL where tp has no valid
   version tag (the generic path). */
static inline DescrEntry *descr_entry(PyTypeObject *tp, PyObject *name, DescrCache *c, PyTypeObject *kind,
                                      PyObject **found)
{
    *found = NULL;
    if (PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG)) {
        for (int i = 0; i < 2; i++)
            if (c->e[i].type == tp && c->e[i].tag == tp->tp_version_tag)
                return &c->e[i];
    }
    PyObject *d = _PyType_Lookup(tp, name); /* borrowed; gives the type a version tag where it can */
    if (!PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG))
        return NULL;
    DescrEntry *e = &c->e[c->next];
    c->next = 1 - c->next;
    e->type = tp;
    e->tag = tp->tp_version_tag;
    e->fn = NULL;
    if (d != NULL && Py_IS_TYPE(d, kind) && tp->tp_getattro == PyObject_GenericGetAttr
        && PyType_IsSubtype(tp, PyDescr_TYPE(d)))
        *found = d;
    return e;
}

/* obj.<name> for a getset attribute: a new reference, NULL with an exception set on error. */
static inline PyObject *getset_read(PyObject *obj, PyObject *name, DescrCache *c)
{
    PyObject *d;
    DescrEntry *e = descr_entry(Py_TYPE(obj), name, c, &PyGetSetDescr_Type, &d);
    if (d != NULL) {
        PyGetSetDef *g = ((PyGetSetDescrObject *)d)->d_getset;
        e->fn = (void (*)(void))g->get;
        e->closure = g->closure;
    }
    if (e != NULL && e->fn != NULL)
        return ((getter)e->fn)(obj, e->closure);
    return PyObject_GetAttr(obj, name);
}

/* obj.<name>(): a new reference, NULL with an exception set on error. */
static inline PyObject *method_call0(PyObject *obj, PyObject *name, DescrCache *c)
{
    static PyObject *no_args; /* () for METH_VARARGS, made once */
    PyObject *d;
    DescrEntry *e = descr_entry(Py_TYPE(obj), name, c, &PyMethodDescr_Type, &d);
    if (d != NULL) {
        PyMethodDef *m = ((PyMethodDescrObject *)d)->d_method;
        int f = m->ml_flags & ~METH_COEXIST;
        if (f == METH_NOARGS || f == (METH_VARARGS | METH_KEYWORDS)) {
            e->fn = (void (*)(void))m->ml_meth;
            e->flags = f;
        }
    }
    if (e == NULL || e->fn == NULL)
        return PyObject_CallMethodNoArgs(obj, name);
    PyObject **dict = _PyObject_GetDictPtr(obj);
    if (dict != NULL && *dict != NULL) {
        int shadowed = PyDict_Contains(*dict, name);
        if (shadowed != 0)
            return shadowed < 0 ? NULL : PyObject_CallMethodNoArgs(obj, name);
    }
    if (e->flags == METH_NOARGS)
        return ((PyCFunction)e->fn)(obj, NULL);
    if (no_args == NULL && (no_args = PyTuple_New(0)) == NULL)
        return NULL;
    return ((PyCFunctionWithKeywords)e->fn)(obj, no_args, NULL);
}

#endif
