/* The L1 mode's handler for a recorded API call, in C: ApiMode.__torch_function__ past the compile check.
 *
 * Why: every torch call under the mode runs this, and in Python its glue (the name cache, the caller's operator,
 * the counters and the call's name, the parent, the lock, the inputs that need gradients, the calls into the
 * row builder) cost several microseconds a call beside the rows themselves. Here the common case runs in C over
 * the CPython API; Python is reached for what must run there: the stack table, the row builder's own
 * fallbacks, the API backward's hooks, a custom Function's forward, and everything rare, which goes to
 * ApiMode._recorded, the Python handler's own continuation (a reentrant checkpoint's replay, collectives, the
 * L0/L2 randomness-only mode). A call that draws random numbers stays here and calls the mode's RandomPolicy
 * (its rng columns, dropout off, host draws) as the Python handler does. The Python handler stays as the
 * fallback and gives the same rows, names, counters, parents and stacks (tests/test_api_handler.py holds them
 * equal).
 *
 * The mode's __torch_function__ is still a Python function, the one getattr finds: dynamo inlines it while
 * compiling (a C handler would break the graph at every op), so it steps aside there and calls Handler.handle
 * otherwise. torch itself finds the handler by a C string, and there the mode answers with the Handler, which
 * torch calls with the same arguments (mode_getattr, Handler_torch_function): no Python frame per call.
 * setup.py builds this for CPython 3.11+ (the frame API it reads: PyFrame_GetLasti, PyCode_GetCode).
 */
#include "_api_calls.h"
#include <frameobject.h>
/* the attributes read at their slots (_slot_attrs.h) */
SLOT_CACHE(active);
SLOT_CACHE(api_counters);
SLOT_CACHE(call);
SLOT_CACHE(construct);
SLOT_CACHE(module_stack);
SLOT_CACHE(select_all);

#define API_HANDLER_ABI 2

/* The context's fields, in order, written once: the enum and the CONTEXT_FIELDS tuple the module exports (the
   Python side builds it by these names, api_mode.handler_context, and checks them at import: c_contract.py). */
#define CONTEXT(X) X(C_MODE, "mode") X(C_RECORDER, "recorder") X(C_LOCK_ACQUIRE, "lock_acquire") \
    X(C_LOCK_RELEASE, "lock_release") X(C_COLLECTIVES, "collectives") X(C_NOTE_ERROR, "note_error") \
    X(C_RESOLVE, "resolve") X(C_OPERATORS, "operators") X(C_OPERATOR_METHODS, "operator_methods") \
    X(C_SLOW, "slow") X(C_DRAWING, "drawing") X(C_SAME_ELEMENTS, "same_elements") X(C_CALL_TYPE, "call_type") \
    X(C_GRAPH_TASK_ID, "graph_task_id") X(C_STACK_ID, "stack_id") X(C_SELECTED, "selected") \
    X(C_IS_CUSTOM_FORWARD, "is_custom_forward") X(C_FORWARD_FRAME, "forward_frame") X(C_GRAD_ENABLED, "grad_enabled") \
    X(C_SEQUENCE_NR, "sequence_nr") X(C_TENSOR, "tensor") X(C_POSITIONS, "positions") X(C_GRAD_INPUTS, "grad_inputs") \
    X(C_CHECKPOINT_NODE, "checkpoint_node") X(C_REPLAY, "replay_in_backward") X(C_CUSTOM_NODE, "custom_node") \
    X(C_CONSUMED, "consumed") X(C_ADD_ROWS, "add_rows") X(C_IO_INPUT, "io_input") X(C_IO_OUTPUT, "io_output") \
    X(C_SHARE_SUMMARY, "share_summary") X(C_MARK_WRITTEN, "mark_written") X(C_ATTACH, "attach_api_backward") \
    X(C_COMPILER_GLOBALS, "compiler_globals")
#define AS_ENUM(id, name) id,
#define AS_NAME(id, name) name,
enum { CONTEXT(AS_ENUM) C_SIZE };
static const char *const CONTEXT_NAMES[] = {CONTEXT(AS_NAME)};

static PyObject *s_active, *s_replaying, *s_record, *s_randomness, *s_pending, *s_poll, *s_api_counters;
static PyObject *s_before;
static PyObject *s_module_stack, *s_call, *s_select_all, *s_construct, *s_requires_grad, *s_grad_fn, *s_output_nr;
static PyObject *s_version, *s_forward, *s_recompute, *s_tensor_family, *s_distributed, *s_input, *s_output;
/* tensor attributes read through their getters (_slot_attrs.h) */
GETSET_CACHE(requires_grad);
GETSET_CACHE(grad_fn);
GETSET_CACHE(output_nr);
GETSET_CACHE(version);

typedef struct {
    PyObject_HEAD
    PyObject *ctx;   /* tuple of C_SIZE objects, in CONTEXT order */
    PyObject *names; /* func -> (family, op) or None: what ctx's resolve gave, so it runs once per function */
    vectorcallfunc vectorcall; /* Handler_torch_function: the handler called as the mode's __torch_function__ */
} Handler;

#define CTX(h, i) PyTuple_GET_ITEM((h)->ctx, (i))
#define MAX_NAMES 4096 /* the name cache is emptied past this many functions (resolve_api's own bound) */

static PyObject *call_func(PyObject *func, PyObject *args, PyObject *kwargs)
{
    if (kwargs == NULL || kwargs == Py_None || (PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs) == 0))
        return PyObject_Call(func, args, NULL);
    return PyObject_Call(func, args, kwargs);
}

static int enter(Handler *h)
{
    return working_enter(CTX(h, C_LOCK_ACQUIRE), CTX(h, C_LOCK_RELEASE), CTX(h, C_RECORDER));
}

static int leave(Handler *h) { return working_leave(CTX(h, C_LOCK_RELEASE), CTX(h, C_RECORDER)); }

/* `except Exception as exc: rec.note_error(f"{what} of {family}.{op}", exc)` (what alone without a family) */
static int note(Handler *h, const char *what, PyObject *family, PyObject *op)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *where = family != NULL ? PyUnicode_FromFormat("%s of %U.%U", what, family, op)
                                     : PyUnicode_FromString(what);
    if (where == NULL) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
        return -1;
    }
    PyErr_Restore(et, ev, tb);
    return note_error(CTX(h, C_NOTE_ERROR), where);
}

/* (family, op) of func, or None when it is not recorded: a new reference, NULL on error. A naming failure is
   noted and reads as None, as in the Python handler. */
static PyObject *resolve(Handler *h, PyObject *func)
{
    PyObject *hit = PyDict_GetItemWithError(h->names, func);
    if (hit != NULL)
        return Py_NewRef(hit);
    if (PyErr_Occurred())
        return NULL;
    PyObject *r = call1(CTX(h, C_RESOLVE), func);
    if (r == NULL)
        return note(h, "naming", NULL, NULL) < 0 ? NULL : Py_NewRef(Py_None);
    if (r != Py_None && !(PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2 && PyUnicode_Check(PyTuple_GET_ITEM(r, 0))
                          && PyUnicode_Check(PyTuple_GET_ITEM(r, 1)))) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "resolve_api must give a (family, op) tuple of strings or None");
        return note(h, "naming", NULL, NULL) < 0 ? NULL : Py_NewRef(Py_None);
    }
    if (PyDict_GET_SIZE(h->names) >= MAX_NAMES)
        PyDict_Clear(h->names);
    if (PyDict_SetItem(h->names, func, r) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

/* naming.tensor_operator: the dunder the caller's instruction used (x + y: Tensor.__add__), from the same
   table (naming.OPERATOR_AT, keyed by opcode << 8 | oparg). A new reference. */
static PyObject *tensor_operator(Handler *h, PyObject *resolved, PyFrameObject *frame)
{
    if (frame == NULL)
        return Py_NewRef(resolved);
    PyCodeObject *code = PyFrame_GetCode(frame);
    PyObject *bytes = PyCode_GetCode(code);
    Py_DECREF(code);
    if (bytes == NULL)
        return NULL;
    int lasti = PyFrame_GetLasti(frame);
    PyObject *out = NULL;
    if (lasti < 0 || lasti + 1 >= PyBytes_GET_SIZE(bytes)) {
        out = Py_NewRef(resolved);
        goto done;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(bytes);
    PyObject *key = PyLong_FromLong(((long)b[lasti] << 8) | b[lasti + 1]);
    if (key == NULL)
        goto done;
    PyObject *dunder = PyDict_GetItemWithError(CTX(h, C_OPERATORS), key);
    Py_DECREF(key);
    if (dunder == NULL) {
        if (!PyErr_Occurred())
            out = Py_NewRef(resolved);
        goto done;
    }
    PyObject *method = PyDict_GetItemWithError(CTX(h, C_OPERATOR_METHODS), dunder);
    if (method == NULL && PyErr_Occurred())
        goto done;
    int same = method != NULL ? PyObject_RichCompareBool(method, PyTuple_GET_ITEM(resolved, 1), Py_EQ) : 0;
    if (same < 0)
        goto done;
    out = same ? PyTuple_Pack(2, s_tensor_family, dunder) : Py_NewRef(resolved);
done:
    Py_DECREF(bytes);
    return out;
}

/* Recorder.open_api: the call's counter, name, parent, direction, selection, stack and index. A new Call and
   its dump flag; NULL on error. */
static PyObject *open_api(Handler *h, PyObject *resolved, PyFrameObject *frame, int *dump)
{
    PyObject *rec = CTX(h, C_RECORDER), *family = PyTuple_GET_ITEM(resolved, 0), *op = PyTuple_GET_ITEM(resolved, 1);
    PyObject *counters = NULL, *name = NULL, *stack = NULL, *parent = NULL, *direction = NULL, *sid = NULL;
    PyObject *idx = NULL, *c = NULL, *counter = NULL;
    counters = SLOT_GET(rec, api_counters);
    if (counters == NULL || !PyDict_Check(counters)) {
        if (counters != NULL)
            PyErr_SetString(PyExc_TypeError, "Recorder.api_counters must be a dict");
        goto done;
    }
    PyObject *had = PyDict_GetItemWithError(counters, resolved);
    if (had == NULL && PyErr_Occurred())
        goto done;
    counter = Py_NewRef(had != NULL ? had : k_zero);
    PyObject *next = PyNumber_Add(counter, k_one);
    if (next == NULL || PyDict_SetItem(counters, resolved, next) < 0) {
        Py_XDECREF(next);
        goto done;
    }
    Py_DECREF(next);
    PyObject *count = count_text(counter);
    name = count != NULL ? dotted((PyObject *[]){family, op, count, s_forward}, 4) : NULL; /* naming.api_call_name */
    Py_XDECREF(count);
    stack = SLOT_GET(rec, module_stack);
    if (name == NULL || stack == NULL)
        goto done;
    Py_ssize_t depth = PyObject_Length(stack);
    if (depth < 0)
        goto done;
    if (depth) {
        PyObject *top = PySequence_GetItem(stack, depth - 1);
        PyObject *call = top != NULL ? PySequence_GetItem(top, 1) : NULL;
        Py_XDECREF(top);
        parent = call != NULL ? SLOT_GET(call, call) : NULL;
        Py_XDECREF(call);
    } else {
        parent = Py_NewRef(s_empty);
    }
    if (parent == NULL)
        goto done;
    PyObject *task = PyObject_CallNoArgs(CTX(h, C_GRAPH_TASK_ID));
    if (task == NULL)
        goto done;
    int inside = PyObject_RichCompareBool(task, k_minus_one, Py_NE);
    Py_DECREF(task);
    if (inside < 0)
        goto done;
    direction = Py_NewRef(inside ? s_recompute : s_forward);
    int all = truth(SLOT_GET(rec, select_all));
    if (all < 0)
        goto done;
    if (!all) {
        PyObject *argv[] = {name, family, op};
        all = truth(PyObject_Vectorcall(CTX(h, C_SELECTED), argv, 3, NULL));
        if (all < 0)
            goto done;
    }
    *dump = all;
    if (all) {
        sid = call1(CTX(h, C_STACK_ID), frame != NULL ? (PyObject *)frame : Py_None);
        idx = sid != NULL ? take_index(rec) : NULL;
        if (idx == NULL)
            goto done;
        if (depth) {
            PyObject *construct = SLOT_GET(rec, construct);
            int orphan = !PyUnicode_Check(parent) || PyUnicode_GET_LENGTH(parent) == 0; /* `parent or None` */
            int failed = construct == NULL || PyObject_SetItem(construct, name, orphan ? Py_None : parent) < 0;
            Py_XDECREF(construct);
            if (failed)
                goto done;
        }
    } else {
        sid = Py_NewRef(k_minus_one);
        idx = Py_NewRef(k_minus_one);
    }
    PyObject *argv[] = {name, family, op, counter, direction, s_empty, parent, sid, idx, s_empty, s_empty,
                        all ? Py_True : Py_False};
    c = new_call(CTX(h, C_CALL_TYPE), argv, 12);
done:
    Py_XDECREF(counters);
    Py_XDECREF(counter);
    Py_XDECREF(name);
    Py_XDECREF(stack);
    Py_XDECREF(parent);
    Py_XDECREF(direction);
    Py_XDECREF(sid);
    Py_XDECREF(idx);
    return c;
}

/* Recorder.add_rows(c, "forward", io, value, is_kwarg=..., set_producer=...) for a call that dumps */
static int add_rows(Handler *h, PyObject *c, PyObject *name, int output, PyObject *value, int is_kwarg)
{
    return add_rows_c(CTX(h, C_RECORDER), CTX(h, C_ADD_ROWS), c, name, s_forward, output ? s_output : s_input,
                      CTX(h, output ? C_IO_OUTPUT : C_IO_INPUT), value, s_empty, is_kwarg, output);
}

/* A scalar leaf: None, a bool, an int, a float or a str itself, never a tensor */
static inline int plain_scalar(PyObject *x)
{
    return x == Py_None || PyFloat_CheckExact(x) || PyLong_CheckExact(x) || PyBool_Check(x) || PyUnicode_CheckExact(x);
}

/* A list, tuple or dict (a subclass too): leaves() walks into it */
static inline int nested(PyObject *x)
{
    return PyList_Check(x) || PyTuple_Check(x) || PyDict_Check(x);
}

/* 1 where an argument can be read here: anything but a list, tuple or dict; a list or tuple itself (not a
   namedtuple, whose paths are its fields) of scalars and tensors; or any list, tuple, Size or dict of scalars
   only (no tensor, so no gradient input whatever its path). 0 where it must be walked by leaves(); -1 on error */
static int one_level(PyObject *v, PyObject *tensor)
{
    if (!nested(v))
        return 1;
    if (PyDict_Check(v)) {
        Py_ssize_t pos = 0;
        PyObject *key, *item;
        while (PyDict_Next(v, &pos, &key, &item))
            if (!plain_scalar(item))
                return 0;
        return 1;
    }
    int exact = PyList_CheckExact(v) || PyTuple_CheckExact(v);
    PyObject *seq = PySequence_Fast(v, ""); /* the same object, held */
    if (seq == NULL)
        return -1;
    int ok = 1;
    for (Py_ssize_t i = 0; ok == 1 && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (plain_scalar(item))
            continue;
        if (!exact || nested(item))
            ok = 0;
        else
            ok = PyObject_IsInstance(item, tensor);
    }
    Py_DECREF(seq);
    return ok;
}

/* Append (path, key) to *out where t is a tensor that requires grad: api_backward.grad_inputs' key. */
static int grad_input(PyObject **out, PyObject *path, PyObject *t, PyObject *tensor)
{
    int is = PyObject_IsInstance(t, tensor);
    if (is <= 0)
        return is;
    int req = truth(GETSET_GET(t, requires_grad));
    if (req <= 0)
        return req;
    PyObject *fn = GETSET_GET(t, grad_fn), *key;
    if (fn == NULL)
        return -1;
    if (fn != Py_None) {
        PyObject *nr = GETSET_GET(t, output_nr), *id = PyLong_FromVoidPtr(fn);
        key = nr != NULL && id != NULL ? PyTuple_Pack(4, id, nr, fn, t) : NULL;
        Py_XDECREF(nr);
        Py_XDECREF(id);
    } else {
        PyObject *id = PyLong_FromVoidPtr(t);
        key = id != NULL ? PyTuple_Pack(4, id, k_minus_one, Py_None, t) : NULL;
        Py_XDECREF(id);
    }
    Py_DECREF(fn);
    PyObject *pair = key != NULL ? PyTuple_Pack(2, path, key) : NULL;
    Py_XDECREF(key);
    if (pair == NULL)
        return -1;
    if (*out == NULL && (*out = PyList_New(0)) == NULL) {
        Py_DECREF(pair);
        return -1;
    }
    int failed = PyList_Append(*out, pair);
    Py_DECREF(pair);
    return failed;
}

/* grad_input of an argument one_level() accepted: of v itself, or of each tensor in it at its path
   f"{path}.{i}", as walk() gives it */
static int grad_inputs_of(PyObject **out, PyObject *path, PyObject *v, PyObject *tensor)
{
    if (!nested(v))
        return grad_input(out, path, v, tensor);
    if (PyDict_Check(v) || !(PyList_CheckExact(v) || PyTuple_CheckExact(v)))
        return 0; /* scalars only */
    PyObject *seq = PySequence_Fast(v, "");
    if (seq == NULL)
        return -1;
    int failed = 0;
    for (Py_ssize_t i = 0; !failed && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i)); /* a list may change while Python runs */
        if (!plain_scalar(item)) {
            PyObject *sub = indexed(path, i);
            failed = sub == NULL || grad_input(out, sub, item, tensor) < 0;
            Py_XDECREF(sub);
        }
        Py_DECREF(item);
    }
    Py_DECREF(seq);
    return failed ? -1 : 0;
}

/* api_backward.grad_inputs: (path, key) of the tensor inputs that require grad, or None. Positional and keyword
   arguments are read here, and containers one level deep (one_level); deeper ones, a keyword that is not a
   str or an argument list past the positions go to the Python function (leaves()). */
static PyObject *grad_inputs(Handler *h, PyObject *args, PyObject *kwargs)
{
    PyObject *positions = CTX(h, C_POSITIONS), *tensor = CTX(h, C_TENSOR);
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    int has_kw = kwargs != NULL && PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs) > 0;
    int flat = n <= PyTuple_GET_SIZE(positions) && (kwargs == NULL || kwargs == Py_None || PyDict_CheckExact(kwargs));
    for (Py_ssize_t i = 0; flat == 1 && i < n; i++)
        flat = one_level(PyTuple_GET_ITEM(args, i), tensor);
    if (flat == 1 && has_kw) {
        Py_ssize_t pos = 0;
        PyObject *key, *a;
        while (flat == 1 && PyDict_Next(kwargs, &pos, &key, &a))
            flat = PyUnicode_CheckExact(key) ? one_level(a, tensor) : 0;
    }
    if (flat < 0)
        return NULL;
    if (!flat)
        return call2(CTX(h, C_GRAD_INPUTS), args, kwargs != NULL ? kwargs : Py_None);
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i), *path = PyTuple_GET_ITEM(positions, i);
        if (grad_inputs_of(&out, path, a, tensor) < 0)
            goto fail;
    }
    if (has_kw) {
        PyObject *items = PyDict_Items(kwargs); /* a snapshot: reading a tensor's attributes may run Python code */
        if (items == NULL)
            goto fail;
        int failed = 0;
        for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(items); i++) {
            PyObject *kv = PyList_GET_ITEM(items, i), *key = PyTuple_GET_ITEM(kv, 0), *a = PyTuple_GET_ITEM(kv, 1);
            failed = grad_inputs_of(&out, key, a, tensor) < 0;
        }
        Py_DECREF(items);
        if (failed)
            goto fail;
    }
    return out != NULL ? out : Py_NewRef(Py_None);
fail:
    Py_XDECREF(out);
    return NULL;
}

/* What a reentrant checkpoint's node or a custom Function's output among the inputs needs before the input
   rows (ApiMode's loop over grad_inputs). */
static int before_inputs(Handler *h, PyObject *inputs)
{
    Py_ssize_t n = PyList_GET_SIZE(inputs);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PySequence_GetItem(PyList_GET_ITEM(inputs, i), 1);
        if (key == NULL)
            return -1;
        PyObject *node = PyTuple_Check(key) && PyTuple_GET_SIZE(key) == 4 ? PyTuple_GET_ITEM(key, 2) : NULL;
        PyObject *r = Py_NewRef(Py_None);
        if (node == NULL) {
            PyErr_SetString(PyExc_TypeError, "grad_inputs must give (path, (id, nr, node, tensor)) pairs");
            Py_CLEAR(r);
        } else if ((PyObject *)Py_TYPE(node) == CTX(h, C_CHECKPOINT_NODE)) {
            Py_DECREF(r);
            r = call1(CTX(h, C_REPLAY), node);
        } else {
            int custom = PyObject_IsInstance(node, CTX(h, C_CUSTOM_NODE));
            if (custom != 0) {
                Py_DECREF(r);
                r = custom > 0 ? call2(CTX(h, C_CONSUMED), node, PyTuple_GET_ITEM(key, 3)) : NULL;
            }
        }
        Py_DECREF(key);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* A call's outputs have no node of the call's (CallGraph.of gives None, attach_api_backward does nothing) when
   the output is one tensor without grad_fn, or no tensor: read here, so those calls skip the Python call. */
static int may_have_backward(Handler *h, PyObject *out)
{
    if (PyTuple_Check(out) || PyList_Check(out) || PyDict_Check(out))
        return 1;
    int is = PyObject_IsInstance(out, CTX(h, C_TENSOR));
    if (is <= 0)
        return is;
    PyObject *fn = GETSET_GET(out, grad_fn);
    if (fn == NULL)
        return -1;
    Py_DECREF(fn);
    return fn != Py_None;
}

/* Everything from the input rows to the output rows of a call that is recorded the common way. ``policy`` is the
 * mode's RandomPolicy where the call draws random numbers (its ``before`` fills the call's rng columns and may
 * change what runs and its arguments, as in ApiMode._recorded), else NULL. */
static PyObject *record(Handler *h, PyObject *func, PyObject *resolved, PyFrameObject *frame, PyObject *args,
                        PyObject *kwargs, PyObject *policy)
{
    PyObject *family = PyTuple_GET_ITEM(resolved, 0), *op = PyTuple_GET_ITEM(resolved, 1);
    PyObject *c = NULL, *name = NULL, *inputs = NULL, *first = NULL, *version = NULL, *seq0 = NULL, *out = NULL;
    PyObject *drawn = NULL; /* policy.before's (run, args, kwargs): args and kwargs then point into it */
    int dump = 0, grads = 0;
    if (enter(h) < 0)
        return NULL;
    /* an async collective may have completed: read it before it changes */
    PyObject *coll = CTX(h, C_COLLECTIVES);
    int pending = truth(PyObject_GetAttr(coll, s_pending));
    if (pending > 0) {
        PyObject *r = PyObject_CallMethodNoArgs(coll, s_poll);
        pending = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    if (pending < 0)
        goto inputs_failed;
    if (frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        int fwd = PyUnicode_Compare(code->co_name, s_forward) == 0;
        Py_DECREF(code);
        if (fwd) {
            int custom = truth(call1(CTX(h, C_IS_CUSTOM_FORWARD), (PyObject *)frame));
            PyObject *r = custom > 0 ? call1(CTX(h, C_FORWARD_FRAME), (PyObject *)frame) : NULL;
            if (custom < 0 || (custom > 0 && r == NULL))
                goto inputs_failed;
            Py_XDECREF(r);
        }
    }
    c = open_api(h, resolved, frame, &dump);
    if (c == NULL || (name = SLOT_GET(c, call)) == NULL)
        goto inputs_failed;
    if (policy != NULL) {
        PyObject *kw = kwargs != NULL && kwargs != Py_None ? Py_NewRef(kwargs) : PyDict_New();
        drawn = kw != NULL ? PyObject_CallMethodObjArgs(policy, s_before, c, func, args, kw, NULL) : NULL;
        Py_XDECREF(kw);
        if (drawn == NULL)
            goto inputs_failed;
        if (!PyTuple_Check(drawn) || PyTuple_GET_SIZE(drawn) != 3 || !PyTuple_Check(PyTuple_GET_ITEM(drawn, 1))
                || !PyDict_Check(PyTuple_GET_ITEM(drawn, 2))) {
            PyErr_SetString(PyExc_TypeError, "RandomPolicy.before must give (callable, tuple, dict)");
            goto inputs_failed;
        }
        args = PyTuple_GET_ITEM(drawn, 1);
        kwargs = PyTuple_GET_ITEM(drawn, 2);
    }
    if (dump) {
        grads = truth(PyObject_CallNoArgs(CTX(h, C_GRAD_ENABLED)));
        if (grads < 0)
            goto inputs_failed;
    }
    if (grads) {
        inputs = grad_inputs(h, args, kwargs);
        if (inputs == NULL)
            goto inputs_failed;
        if (inputs != Py_None && (!PyList_Check(inputs) || before_inputs(h, inputs) < 0)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "grad_inputs must give a list or None");
            goto inputs_failed;
        }
        if (inputs != Py_None && PyList_GET_SIZE(inputs) == 0)
            Py_SETREF(inputs, Py_NewRef(Py_None));
    }
    if (dump) {
        if (add_rows(h, c, name, 0, args, 0) < 0)
            goto inputs_failed;
        if (kwargs != NULL && kwargs != Py_None) {
            int any = PyObject_IsTrue(kwargs);
            if (any < 0 || (any && add_rows(h, c, name, 0, kwargs, 1) < 0))
                goto inputs_failed;
        }
    }
    if (grads && (seq0 = PyObject_CallNoArgs(CTX(h, C_SEQUENCE_NR))) == NULL)
        goto inputs_failed;
    if (PyTuple_GET_SIZE(args)) {
        int is = PyObject_IsInstance(PyTuple_GET_ITEM(args, 0), CTX(h, C_TENSOR));
        if (is < 0)
            goto inputs_failed;
        if (is) {
            first = Py_NewRef(PyTuple_GET_ITEM(args, 0));
            if ((version = GETSET_GET(first, version)) == NULL)
                goto inputs_failed;
        }
    }
    if (leave(h) < 0)
        goto fail;
    goto run;
inputs_failed:
    Py_CLEAR(c);
    {
        int noted = note(h, "inputs", family, op);
        if (leave(h) < 0 || noted < 0)
            goto fail;
    }
run:
    if (c == NULL) {
        out = call_func(func, args, kwargs);
        goto fail; /* not a failure: releases what was taken and returns out */
    }
    out = call_func(drawn != NULL ? PyTuple_GET_ITEM(drawn, 0) : func, args, kwargs);
    if (out == NULL)
        goto fail;
    if (enter(h) < 0)
        goto error;
    int same = PySet_Contains(CTX(h, C_SAME_ELEMENTS), resolved);
    if (same < 0)
        goto outputs_failed;
    if (same && PyTuple_GET_SIZE(args)) {
        int a = PyObject_IsInstance(out, CTX(h, C_TENSOR));
        int b = a > 0 ? PyObject_IsInstance(PyTuple_GET_ITEM(args, 0), CTX(h, C_TENSOR)) : a;
        if (b < 0)
            goto outputs_failed;
        if (b) {
            PyObject *r = call2(CTX(h, C_SHARE_SUMMARY), out, PyTuple_GET_ITEM(args, 0));
            if (r == NULL)
                goto outputs_failed;
            Py_DECREF(r);
        }
    }
    if (dump) {
        PyObject *value = PyTuple_Check(out) || PyList_Check(out) || PyDict_Check(out) ? Py_NewRef(out)
                                                                                      : PyTuple_Pack(1, out);
        int failed = value == NULL || add_rows(h, c, name, 1, value, 0) < 0;
        Py_XDECREF(value);
        if (failed)
            goto outputs_failed;
    }
    if (first != NULL && out != first) {
        PyObject *now = GETSET_GET(first, version);
        int changed = now != NULL ? PyObject_RichCompareBool(now, version, Py_NE) : -1;
        Py_XDECREF(now);
        PyObject *r = changed > 0 ? call2(CTX(h, C_MARK_WRITTEN), first, name) : NULL;
        if (changed < 0 || (changed > 0 && r == NULL))
            goto outputs_failed;
        Py_XDECREF(r);
    }
    if (grads) {
        int may = may_have_backward(h, out);
        if (may < 0)
            goto outputs_failed;
        if (may) {
            PyObject *argv[] = {c, out, inputs, seq0};
            PyObject *r = PyObject_Vectorcall(CTX(h, C_ATTACH), argv, 4, NULL);
            if (r == NULL)
                goto outputs_failed;
            Py_DECREF(r);
        }
    }
    if (leave(h) < 0)
        goto error;
    goto fail;
outputs_failed:
    {
        int noted = note(h, "outputs", family, op);
        if (leave(h) < 0 || noted < 0)
            goto error;
    }
    goto fail;
error:
    Py_CLEAR(out);
fail:
    Py_XDECREF(c);
    Py_XDECREF(name);
    Py_XDECREF(inputs);
    Py_XDECREF(first);
    Py_XDECREF(version);
    Py_XDECREF(seq0);
    Py_XDECREF(drawn);
    return out;
}

/* ApiMode.__torch_function__ once it is not compiling. ``direct``: torch called the handler itself (the mode's
   lookup by C string gave it, Handler_torch_function), so the current frame made the call; otherwise the current
   frame is the mode's Python __torch_function__ and its caller made the call. */
static PyObject *handle_call(Handler *h, PyObject *func, PyObject *args, PyObject *kwargs, int direct)
{
    if (!PyTuple_Check(args) || !(kwargs == Py_None || PyDict_Check(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "handle: args must be a tuple and kwargs a dict or None");
        return NULL;
    }
    PyObject *rec = CTX(h, C_RECORDER), *mode = CTX(h, C_MODE);
    int on = truth(SLOT_GET(rec, active));
    if (on < 0)
        return NULL;
    if (on) {
        int busy = truth(SLOT_GET(rec, busy));
        if (busy < 0)
            return NULL;
        on = !busy;
    }
    if (!on)
        return call_func(func, args, kwargs);
    PyObject *resolved = resolve(h, func);
    if (resolved == NULL)
        return NULL;
    if (resolved == Py_None) {
        Py_DECREF(resolved);
        return call_func(func, args, kwargs);
    }
    PyFrameObject *here = PyEval_GetFrame();
    PyFrameObject *frame = here == NULL ? NULL : direct ? (PyFrameObject *)Py_NewRef(here) : PyFrame_GetBack(here);
    PyObject *out = NULL, *named = NULL, *policy = NULL;
    int slow = truth(PyObject_GetAttr(mode, s_replaying));
    if (slow == 0) {
        int record = truth(PyObject_GetAttr(mode, s_record));
        slow = record < 0 ? -1 : !record;
    }
    if (slow == 0)
        slow = PyUnicode_Compare(PyTuple_GET_ITEM(resolved, 0), s_distributed) == 0;
    if (slow == 0) {
        if (PyUnicode_Compare(PyTuple_GET_ITEM(resolved, 0), s_tensor_family) == 0) {
            named = tensor_operator(h, resolved, frame);
            if (named == NULL) { /* as the Python handler: a naming failure keeps the name it had */
                if (note(h, "naming", NULL, NULL) < 0)
                    goto done;
                named = Py_NewRef(resolved);
            }
        } else {
            named = Py_NewRef(resolved);
        }
        policy = PyObject_GetAttr(mode, s_randomness);
        if (policy == NULL)
            goto done;
        int draws = policy != Py_None ? PySet_Contains(CTX(h, C_DRAWING), named) : 0;
        if (draws <= 0)
            Py_CLEAR(policy); /* record() is handed the policy only for a call that draws */
        if (draws < 0)
            slow = -1;
    }
    if (slow < 0)
        goto done;
    if (slow) {
        PyObject *a[] = {func, resolved, frame != NULL ? (PyObject *)frame : Py_None, args, kwargs};
        out = PyObject_Vectorcall(CTX(h, C_SLOW), a, 5, NULL);
    } else {
        out = record(h, func, named, frame, args, kwargs, policy);
    }
done:
    Py_XDECREF(policy);
    Py_XDECREF(named);
    Py_XDECREF(frame);
    Py_DECREF(resolved);
    return out;
}

static PyObject *Handler_torch_function(PyObject *self, PyObject *const *argv, size_t nargsf, PyObject *kwnames);

static PyObject *Handler_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *ctx = context_arg(args, kw, C_SIZE, "Handler");
    if (ctx == NULL)
        return NULL;
    if (!PyDict_Check(PyTuple_GET_ITEM(ctx, C_OPERATORS)) || !PyDict_Check(PyTuple_GET_ITEM(ctx, C_OPERATOR_METHODS))
        || !PyAnySet_Check(PyTuple_GET_ITEM(ctx, C_DRAWING)) || !PyAnySet_Check(PyTuple_GET_ITEM(ctx, C_SAME_ELEMENTS))
        || !PyTuple_Check(PyTuple_GET_ITEM(ctx, C_POSITIONS)) || !PyDict_Check(PyTuple_GET_ITEM(ctx, C_COMPILER_GLOBALS))) {
        PyErr_SetString(PyExc_TypeError, "Handler: operators, operator_methods and compiler_globals must be dicts, "
                                         "drawing and same_elements sets, positions a tuple");
        return NULL;
    }
    Handler *h = (Handler *)type->tp_alloc(type, 0);
    if (h == NULL)
        return NULL;
    h->ctx = Py_NewRef(ctx);
    h->vectorcall = Handler_torch_function;
    h->names = PyDict_New();
    if (h->names == NULL) {
        Py_DECREF(h);
        return NULL;
    }
    return (PyObject *)h;
}

static int Handler_traverse(Handler *h, visitproc visit, void *arg)
{
    Py_VISIT(h->ctx);
    Py_VISIT(h->names);
    return 0;
}

static int Handler_clear(Handler *h)
{
    Py_CLEAR(h->ctx);
    Py_CLEAR(h->names);
    return 0;
}

static void Handler_dealloc(Handler *h)
{
    PyObject_GC_UnTrack(h);
    Handler_clear(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

/* 1 where h was cleared (its context let go: a cycle the GC broke), with the RuntimeError set */
static int cleared(Handler *h)
{
    if (h->ctx != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "Handler: cleared");
    return 1;
}

/* Handler.handle(func, args, kwargs): called by the mode's Python __torch_function__ past its compile check. */
static PyObject *Handler_handle(Handler *h, PyObject *const *argv, Py_ssize_t nargs)
{
    if (cleared(h))
        return NULL;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "handle(func, args, kwargs)");
        return NULL;
    }
    return handle_call(h, argv[0], argv[1], argv[2], 0);
}

static PyObject *s_is_compiling_flag;

/* Handler(func, types, args=(), kwargs=None): the mode's __torch_function__ itself, which torch calls where its
   lookup by C string gave the handler (mode_getattr below). It does what the Python __torch_function__ does
   without its three Python frames: it steps aside while compiling, as torch.compiler.is_compiling() reads it
   outside TorchScript (the flag torch.compiler sets while dynamo traces and while export runs), and handles the
   call otherwise. Dynamo never calls this: it inlines the Python __torch_function__, which getattr finds. */
static PyObject *Handler_torch_function(PyObject *self, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    Handler *h = (Handler *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (cleared(h))
        return NULL;
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) || nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "Handler(func, types, args=(), kwargs=None), positional arguments only");
        return NULL;
    }
    PyObject *func = argv[0];
    PyObject *args = nargs > 2 ? argv[2] : NULL, *kwargs = nargs > 3 ? argv[3] : Py_None;
    PyObject *empty = NULL;
    if (args == NULL && (args = empty = PyTuple_New(0)) == NULL)
        return NULL;
    PyObject *flag = PyDict_GetItemWithError(CTX(h, C_COMPILER_GLOBALS), s_is_compiling_flag); /* borrowed */
    int compiling = flag == NULL ? (PyErr_Occurred() ? -1 : 0) : flag == Py_False ? 0 : PyObject_IsTrue(flag);
    PyObject *out = compiling < 0 ? NULL
                    : compiling ? call_func(func, args, kwargs) : handle_call(h, func, args, kwargs, 1);
    Py_XDECREF(empty);
    return out;
}

/* Handler.__self__: the mode, as a bound __torch_function__ has it (torch checks it before each call) */
static PyObject *Handler_self(Handler *h, void *closure)
{
    (void)closure;
    return cleared(h) ? NULL : Py_NewRef(CTX(h, C_MODE));
}

/* A lookup by a C string the default way, as PyObject_GetAttrString does for a type without tp_getattr: a new str
   of name, looked up by get (the type's tp_getattro). For the tp_getattr functions below, on the names they do not
   answer themselves. */
static PyObject *getattr_by_string(PyObject *obj, const char *name, getattrofunc get)
{
    PyObject *key = PyUnicode_FromString(name);
    if (key == NULL)
        return NULL;
    PyObject *res = get(obj, key);
    Py_DECREF(key);
    return res;
}

/* torch reads __self__ by a C string: answered without making a str; any other name goes the default way */
static PyObject *Handler_getattr(PyObject *self, char *name)
{
    if (strcmp(name, "__self__") == 0)
        return Handler_self((Handler *)self, NULL);
    return getattr_by_string(self, name, PyObject_GenericGetAttr);
}

static PyGetSetDef Handler_getset[] = {
    {"__self__", (getter)Handler_self, NULL, "the mode this handler records for", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef Handler_methods[] = {
    {"handle", (PyCFunction)(void (*)(void))Handler_handle, METH_FASTCALL,
     "handle(func, args, kwargs): the recorded call's result, recorded as ApiMode.__torch_function__ does."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject HandlerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_nb.capture._api_handler.Handler",
    .tp_basicsize = sizeof(Handler),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Handler(ctx): the L1 mode's handler of one recorder (ctx: CONTEXT_FIELDS, in order). Called as "
              "handler(func, types, args=(), kwargs=None), it is the mode's __torch_function__.",
    .tp_new = Handler_new,
    .tp_vectorcall_offset = offsetof(Handler, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getattr = Handler_getattr,
    .tp_getattro = PyObject_GenericGetAttr, /* set with tp_getattr: they are inherited only together */
    .tp_getset = Handler_getset,
    .tp_traverse = (traverseproc)Handler_traverse,
    .tp_clear = (inquiry)Handler_clear,
    .tp_dealloc = (destructor)Handler_dealloc,
    .tp_methods = Handler_methods,
};

/* The mode's attributes looked up by a C string (char *): torch finds a mode's __torch_function__ so, twice on
   every call it dispatches to the mode (its own unrecorded calls and attribute reads included), and calls what it
   found. A Python class has no tp_getattr, so each lookup made a new str from the C string, missed the type's
   method cache and bound a new method; the bound Python __torch_function__ then ran three Python frames (its own,
   torch.compiler.is_compiling's and torch.jit.is_scripting's) before the handler.
   Here the name "__torch_function__" is one interned str, and where getattr would give the class's own
   __torch_function__ (the one string_lookups saw) bound to this mode, and the mode has its C handler (its
   ``_handler``, made for this mode), the handler itself is the answer: torch calls it with the same arguments
   (Handler_torch_function). Anything else is what getattr finds: a subclass's own handler, an instance
   attribute, a mode without the C handler. Any other name goes the default way (a new str and
   PyObject_GetAttr), so a lookup finds exactly what it found before. */
static PyObject *s_torch_function_name, *s_handler_name;
static PyObject *registered_handler; /* the __torch_function__ function of the class string_lookups was given */

/* 1 where h is the C handler made for this mode (and not cleared): the one answer mode_getattr gives in its place */
static int own_handler(PyObject *h, PyObject *mode)
{
    return h != NULL && Py_IS_TYPE(h, &HandlerType) && ((Handler *)h)->ctx != NULL
           && CTX((Handler *)h, C_MODE) == mode;
}

/* The answer of mode_getattr below read without getattr: where the mode's class reads attributes the default way,
   its __torch_function__ is the registered function (a function: not a data descriptor) and its instance dict
   holds no __torch_function__, getattr would bind that function to the mode; where, besides, no data descriptor
   named _handler is on the class and the instance dict's _handler is the mode's own Handler, that handler is the
   answer. A borrowed reference; NULL (no exception) where any of this does not hold, for the getattr path.
   getattr would make a bound method only to compare and drop it, twice on every call torch dispatches. */
static PyObject *dict_handler(PyObject *self)
{
    PyTypeObject *t = Py_TYPE(self);
    if (registered_handler == NULL || t->tp_getattro != PyObject_GenericGetAttr || t->tp_dictoffset == 0
        || _PyType_Lookup(t, s_torch_function_name) != registered_handler)
        return NULL;
    PyObject *hd = _PyType_Lookup(t, s_handler_name);
    if (hd != NULL && Py_TYPE(hd)->tp_descr_set != NULL)
        return NULL;
    PyObject *d = PyObject_GenericGetDict(self, NULL);
    if (d == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *h = NULL;
    if (PyDict_CheckExact(d) && PyDict_GetItemWithError(d, s_torch_function_name) == NULL && !PyErr_Occurred())
        h = PyDict_GetItemWithError(d, s_handler_name);
    if (h == NULL && PyErr_Occurred())
        PyErr_Clear(); /* the getattr path meets it again */
    Py_DECREF(d); /* the mode holds it, and the dict holds h */
    return own_handler(h, self) ? h : NULL;
}

static PyObject *mode_getattr(PyObject *self, char *name)
{
    if (strcmp(name, "__torch_function__") != 0)
        return getattr_by_string(self, name, PyObject_GetAttr);
    PyObject *direct = dict_handler(self);
    if (direct != NULL)
        return Py_NewRef(direct);
    PyObject *res = PyObject_GetAttr(self, s_torch_function_name);
    if (res == NULL || registered_handler == NULL || !PyMethod_Check(res) || PyMethod_GET_SELF(res) != self
        || PyMethod_GET_FUNCTION(res) != registered_handler)
        return res;
    PyObject *h = PyObject_GetAttr(self, s_handler_name);
    if (h == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            Py_DECREF(res);
            return NULL;
        }
        PyErr_Clear();
        return res;
    }
    if (own_handler(h, self)) {
        Py_DECREF(res);
        return h;
    }
    Py_DECREF(h);
    return res;
}

/* string_lookups(cls): give the heap type cls (the mode's class) the lookup above as its tp_getattr; True when it
   has it, False when cls already has a tp_getattr of its own (left as it is). cls's __torch_function__ is the one
   whose bound form the lookup may answer with the mode's C handler. */
static PyObject *string_lookups(PyObject *self, PyObject *cls)
{
    (void)self;
    if (!PyType_Check(cls) || !PyType_HasFeature((PyTypeObject *)cls, Py_TPFLAGS_HEAPTYPE)) {
        PyErr_SetString(PyExc_TypeError, "string_lookups() needs a class defined in Python");
        return NULL;
    }
    PyTypeObject *t = (PyTypeObject *)cls;
    if (t->tp_getattr != NULL && t->tp_getattr != mode_getattr)
        Py_RETURN_FALSE;
    PyObject *tf = _PyType_Lookup(t, s_torch_function_name); /* borrowed */
    if (tf == NULL || !PyFunction_Check(tf)) {
        PyErr_SetString(PyExc_TypeError, "string_lookups() needs a class whose __torch_function__ is a function");
        return NULL;
    }
    Py_XSETREF(registered_handler, Py_NewRef(tf));
    t->tp_getattr = mode_getattr;
    Py_RETURN_TRUE;
}

static PyMethodDef module_methods[] = {
    {"string_lookups", string_lookups, METH_O,
     "string_lookups(cls): lookups of cls's instances' attributes by a C string find __torch_function__ through one "
     "interned str, and give the mode's C handler where getattr would give cls's own __torch_function__."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_api_handler",
                                    "The L1 mode's handler of a recorded API call, in C.", -1, module_methods, NULL,
                                    NULL, NULL, NULL};

#define INTERN API_INTERN

PyMODINIT_FUNC PyInit__api_handler(void)
{
    if (api_calls_init() < 0 || INTERN(s_active, "active") || INTERN(s_replaying, "replaying")
        || INTERN(s_record, "record") || INTERN(s_randomness, "randomness") || INTERN(s_before, "before") || INTERN(s_pending, "pending")
        || INTERN(s_poll, "poll") || INTERN(s_api_counters, "api_counters") || INTERN(s_module_stack, "module_stack")
        || INTERN(s_call, "call") || INTERN(s_select_all, "_select_all") || INTERN(s_construct, "construct")
        || INTERN(s_requires_grad, "requires_grad") || INTERN(s_grad_fn, "grad_fn") || INTERN(s_output_nr, "output_nr")
        || INTERN(s_version, "_version") || INTERN(s_forward, "forward") || INTERN(s_recompute, "recompute")
        || INTERN(s_tensor_family, "Tensor") || INTERN(s_distributed, "Distributed") || INTERN(s_input, "input")
        || INTERN(s_output, "output") || INTERN(s_torch_function_name, "__torch_function__")
        || INTERN(s_handler_name, "_handler") || INTERN(s_is_compiling_flag, "_is_compiling_flag"))
        return NULL;
    if (PyType_Ready(&HandlerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (add_layout(m, API_HANDLER_ABI, CONTEXT_NAMES, C_SIZE, "Handler", &HandlerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
