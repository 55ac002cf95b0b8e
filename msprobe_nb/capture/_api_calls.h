/* What the two C halves of L1 recording share (_api_handler.c: a call's forward; _api_backward.c: its backward):
 * the recorder's lock and busy count around the kit's own work, noting a failure as Recorder.note_error does,
 * and Recorder.add_rows through the C row builder. Static functions, included by both extensions (each is its
 * own module); call api_calls_init() once from the module's init.
 */
#ifndef MSPROBE_NB_API_CALLS_H
#define MSPROBE_NB_API_CALLS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_slot_attrs.h"
#include "_dotted_names.h"
#include "_new_call.h"

static PyObject *s_busy, *s_all_data, *s_build_rows, *s_row_ctx, *s_calls, *s_rows, *s_seen, *s_slot, *s_empty;
static PyObject *s_prefix, *s_is_kwarg, *s_set_producer, *s_call_index, *k_zero, *k_one, *k_minus_one;
static PyObject *s_enter, *s_exit;
SLOT_CACHE(all_data);
SLOT_CACHE(build_rows);
SLOT_CACHE(busy);
SLOT_CACHE(call_index);
SLOT_CACHE(calls);
SLOT_CACHE(row_ctx);
SLOT_CACHE(rows);
SLOT_CACHE(seen);
SLOT_CACHE(slot);

#define API_INTERN(var, text) ((var) = PyUnicode_InternFromString(text)) == NULL

static int api_calls_init(void)
{
    if (API_INTERN(s_busy, "busy") || API_INTERN(s_all_data, "_all_data") || API_INTERN(s_build_rows, "build_rows")
        || API_INTERN(s_row_ctx, "_row_ctx") || API_INTERN(s_calls, "calls") || API_INTERN(s_rows, "rows")
        || API_INTERN(s_seen, "_seen") || API_INTERN(s_slot, "slot") || API_INTERN(s_empty, "")
        || API_INTERN(s_prefix, "prefix") || API_INTERN(s_is_kwarg, "is_kwarg")
        || API_INTERN(s_set_producer, "set_producer") || API_INTERN(s_call_index, "call_index")
        || API_INTERN(s_enter, "__enter__") || API_INTERN(s_exit, "__exit__"))
        return -1;
    if ((k_zero = PyLong_FromLong(0)) == NULL || (k_one = PyLong_FromLong(1)) == NULL
        || (k_minus_one = PyLong_FromLong(-1)) == NULL)
        return -1;
    return 0;
}

/* The truth of v (a new reference, released here): 1, 0, or -1 when v is NULL or has no truth value. */
static int truth(PyObject *v)
{
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static inline PyObject *call1(PyObject *f, PyObject *a) { return PyObject_CallOneArg(f, a); }

static PyObject *call2(PyObject *f, PyObject *a, PyObject *b)
{
    PyObject *argv[] = {a, b};
    return PyObject_Vectorcall(f, argv, 2, NULL);
}

/* rec.<name> += delta */
static int add_to(PyObject *obj, PyObject *name, SlotCache *cache, long delta)
{
    PyObject *v = slot_get(obj, name, cache);
    if (v == NULL)
        return -1;
    long n = PyLong_AsLong(v);
    Py_DECREF(v);
    if (n == -1 && PyErr_Occurred())
        return -1;
    PyObject *w = PyLong_FromLong(n + delta);
    if (w == NULL)
        return -1;
    int r = slot_set(obj, name, w, cache);
    Py_DECREF(w);
    return r;
}

/* rec.call_index, then rec.call_index += 1 (Recorder._take_index): a new reference, NULL on error. */
static PyObject *take_index(PyObject *rec)
{
    PyObject *idx = SLOT_GET(rec, call_index);
    PyObject *after = idx != NULL ? PyNumber_Add(idx, k_one) : NULL;
    int failed = after == NULL || SLOT_SET(rec, call_index, after) < 0;
    Py_XDECREF(after);
    if (failed)
        Py_CLEAR(idx);
    return idx;
}

/* The lock and busy count around the kit's own work, as Recorder.working() (the caller turns torch function
   handling off where it is on: a mode's handler runs with it off already). */
static int working_enter(PyObject *acquire, PyObject *release, PyObject *rec)
{
    PyObject *r = PyObject_CallNoArgs(acquire);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    if (add_to(rec, s_busy, &sc_busy, 1) < 0) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        r = PyObject_CallNoArgs(release);
        Py_XDECREF(r);
        PyErr_Clear();
        PyErr_Restore(et, ev, tb);
        return -1;
    }
    return 0;
}

/* The other half; an exception already raised (the kit's own, to note or to propagate) wins over its own. */
static int working_leave(PyObject *release, PyObject *rec)
{
    PyObject *et, *ev, *tb, *ot = NULL, *ov = NULL, *ob = NULL;
    PyErr_Fetch(&et, &ev, &tb);
    if (add_to(rec, s_busy, &sc_busy, -1) < 0)
        PyErr_Fetch(&ot, &ov, &ob);
    PyObject *r = PyObject_CallNoArgs(release);
    if (r == NULL) {
        if (ot == NULL)
            PyErr_Fetch(&ot, &ov, &ob);
        else
            PyErr_Clear();
    }
    Py_XDECREF(r);
    if (et != NULL) {
        Py_XDECREF(ot);
        Py_XDECREF(ov);
        Py_XDECREF(ob);
        PyErr_Restore(et, ev, tb);
        return -1;
    }
    if (ot != NULL) {
        PyErr_Restore(ot, ov, ob);
        return -1;
    }
    return 0;
}

/* Recorder.working() whole, for the kit's hooks (they run outside any mode's handler): the lock and busy count,
   and torch function handling off (no_torch_function: torch._C.DisableTorchFunction), so the kit's reads of
   tensor attributes go through no mode. *off: what working_off_leave takes. */
static inline int working_off_enter(PyObject *acquire, PyObject *release, PyObject *no_torch_function,
                                    PyObject *rec, PyObject **off)
{
    if (working_enter(acquire, release, rec) < 0)
        return -1;
    *off = PyObject_CallNoArgs(no_torch_function);
    PyObject *entered = *off != NULL ? PyObject_CallMethodNoArgs(*off, s_enter) : NULL;
    if (entered == NULL) {
        Py_CLEAR(*off);
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        working_leave(release, rec);
        PyErr_Clear();
        PyErr_Restore(et, ev, tb);
        return -1;
    }
    Py_DECREF(entered);
    return 0;
}

/* The other half (it releases off); an exception already raised wins over its own. */
static inline int working_off_leave(PyObject *release, PyObject *rec, PyObject *off)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *r = PyObject_CallMethodObjArgs(off, s_exit, Py_None, Py_None, Py_None, NULL);
    Py_DECREF(off);
    if (r == NULL && et == NULL)
        PyErr_Fetch(&et, &ev, &tb);
    else if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
    PyErr_Restore(et, ev, tb);
    return working_leave(release, rec) < 0 || PyErr_Occurred() ? -1 : 0;
}

/* cache.get(key), else fill(key) (which fills the cache itself): a new reference, NULL on error. */
static inline PyObject *cached(PyObject *cache, PyObject *fill, PyObject *key)
{
    PyObject *hit = PyDict_GetItemWithError(cache, key);
    if (hit != NULL)
        return Py_NewRef(hit);
    return PyErr_Occurred() ? NULL : PyObject_CallOneArg(fill, key);
}

/* `except Exception as exc: rec.note_error(where, exc)` (where: a new reference, released here; NULL: an error
   already raised): 0 when noted (the error is cleared), -1 when the exception is not an Exception
   (KeyboardInterrupt...) or noting it failed (it stays raised). */
static int note_error(PyObject *note_fn, PyObject *where)
{
    if (where == NULL || !PyErr_ExceptionMatches(PyExc_Exception)) {
        Py_XDECREF(where);
        return -1;
    }
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (tb != NULL && ev != NULL)
        PyException_SetTraceback(ev, tb);
    PyObject *r = call2(note_fn, where, ev != NULL ? ev : Py_None);
    Py_DECREF(where);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Recorder.add_rows(c, direction, io, value, prefix=..., is_kwarg=..., set_producer=...) for a call that dumps
   (name: c.call; base: the name the rows' paths extend; io_code: io's code in Recorder._ios): through the C row builder where the recorder uses it and
   no data_mode filter applies, else through add_rows itself (py_add_rows, which applies the filter). */
static int add_rows_base(PyObject *rec, PyObject *py_add_rows, PyObject *c, PyObject *name, PyObject *base,
                         PyObject *direction, PyObject *io, PyObject *io_code, PyObject *value, PyObject *prefix,
                         int is_kwarg, int set_producer)
{
    int all = truth(SLOT_GET(rec, all_data));
    if (all < 0)
        return -1;
    PyObject *build = SLOT_GET(rec, build_rows);
    if (build == NULL)
        return -1;
    if (!all || build == Py_None) {
        Py_DECREF(build);
        PyObject *argv[] = {c, direction, io, value, prefix, is_kwarg ? Py_True : Py_False,
                            set_producer ? Py_True : Py_False};
        PyObject *kwnames = PyTuple_Pack(3, s_prefix, s_is_kwarg, s_set_producer);
        PyObject *r = kwnames != NULL ? PyObject_Vectorcall(py_add_rows, argv, 4, kwnames) : NULL;
        Py_XDECREF(kwnames);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
        return 0;
    }
    int failed = -1;
    PyObject *calls = SLOT_GET(rec, calls), *slot = SLOT_GET(c, slot);
    PyObject *rows = SLOT_GET(rec, rows), *seen = SLOT_GET(rec, seen);
    PyObject *ctx = SLOT_GET(rec, row_ctx), *k = NULL;
    if (calls == NULL || slot == NULL || rows == NULL || seen == NULL || ctx == NULL)
        goto done;
    if (!PyList_Check(calls) || !PyList_Check(rows)) {
        PyErr_SetString(PyExc_TypeError, "Recorder.calls and Recorder.rows must be lists");
        goto done;
    }
    Py_ssize_t ks = PyLong_AsSsize_t(slot), ncalls = PyList_GET_SIZE(calls);
    if (ks == -1 && PyErr_Occurred())
        goto done;
    int fresh = ks < 0 || ks >= ncalls || PyList_GET_ITEM(calls, ks) != c; /* the call's first rows this step */
    if (fresh)
        ks = ncalls;
    k = PyLong_FromSsize_t(ks);
    if (k == NULL)
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *argv[] = {rows, value, prefix, k, base, io_code, is_kwarg ? Py_True : Py_False,
                        set_producer ? Py_True : Py_False, name, seen, ctx};
    PyObject *r = PyObject_Vectorcall(build, argv, 11, NULL);
    failed = r == NULL ? -1 : 0;
    Py_XDECREF(r);
    if (fresh && PyList_GET_SIZE(rows) > n) { /* rows were added (even if a later leaf failed): they point at k */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (SLOT_SET(c, slot, k) < 0 || PyList_Append(calls, c) < 0)
            failed = -1;
        if (et != NULL) {
            PyErr_Clear();
            PyErr_Restore(et, ev, tb);
        }
    }
done:
    Py_DECREF(build);
    Py_XDECREF(calls);
    Py_XDECREF(slot);
    Py_XDECREF(rows);
    Py_XDECREF(seen);
    Py_XDECREF(ctx);
    Py_XDECREF(k);
    return failed;
}

/* add_rows_base for the rows' usual names, f"{c.call}.{io}" (every io but parameters_grad, named by the call). */
static int add_rows_c(PyObject *rec, PyObject *py_add_rows, PyObject *c, PyObject *name, PyObject *direction,
                      PyObject *io, PyObject *io_code, PyObject *value, PyObject *prefix, int is_kwarg,
                      int set_producer)
{
    PyObject *base = dotted((PyObject *[]){name, io}, 2);
    if (base == NULL)
        return -1;
    int r = add_rows_base(rec, py_add_rows, c, name, base, direction, io, io_code, value, prefix, is_kwarg,
                          set_producer);
    Py_DECREF(base);
    return r;
}

/* The context tuple of a C type's constructor, `Type(ctx)` (a borrowed reference), checked to hold `size`
   fields; NULL with TypeError or ValueError naming the type otherwise. */
static PyObject *context_arg(PyObject *args, PyObject *kw, Py_ssize_t size, const char *type)
{
    if (kw != NULL && PyDict_GET_SIZE(kw) != 0) {
        PyErr_Format(PyExc_TypeError, "%s(ctx) takes no keywords", type);
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) != 1 || !PyTuple_Check(PyTuple_GET_ITEM(args, 0))) {
        PyErr_Format(PyExc_TypeError, "%s(ctx) takes one tuple", type);
        return NULL;
    }
    PyObject *ctx = PyTuple_GET_ITEM(args, 0);
    if (PyTuple_GET_SIZE(ctx) != size) {
        PyErr_Format(PyExc_ValueError, "%s: the context has %zd fields, expected %zd", type, PyTuple_GET_SIZE(ctx),
                     size);
        return NULL;
    }
    return ctx;
}

/* The module's layout for c_contract.py: ABI and CONTEXT_FIELDS (names, in the context's order), and its type. */
static int add_layout(PyObject *m, int abi, const char *const *names, Py_ssize_t n, const char *type_name,
                      PyTypeObject *type)
{
    PyObject *fields = PyTuple_New(n);
    for (Py_ssize_t i = 0; fields != NULL && i < n; i++) {
        PyObject *name = PyUnicode_FromString(names[i]);
        if (name == NULL) {
            Py_CLEAR(fields);
            break;
        }
        PyTuple_SET_ITEM(fields, i, name);
    }
    int failed = fields == NULL || PyModule_AddIntConstant(m, "ABI", abi) < 0
                 || PyModule_AddObjectRef(m, "CONTEXT_FIELDS", fields) < 0
                 || PyModule_AddObjectRef(m, type_name, (PyObject *)type) < 0;
    Py_XDECREF(fields);
    return failed ? -1 : 0;
}

#endif
