/* The global module hooks of L0 and mix (and the module stack L1's parents come from), in C: ModuleHooks._pre
 * and ModuleHooks._post past their compile check.
 *
 * Why: every module call runs both hooks, and in Python their glue (the lock, the module's path, its counter,
 * name and parent, the Call, the calls into the row builder, the module stack) cost several microseconds a
 * module call beside the rows themselves. Here the common case runs in C over the CPython API; Python is reached
 * for what must run there (the stack table's walk, the scope/list filter, the module backward's tensor hooks,
 * the parameters' gradient hooks) and for everything rare, which goes to the Python hooks' own bodies: a module
 * seen for the first time (its path is found there), a root model, a torch.compile wrapper. Those bodies stay as
 * the fallback and give the same rows, names, counters, parents and stacks (tests/test_module_hooks_c.py holds
 * them equal).
 *
 * The hooks torch calls are still Python functions: dynamo inlines them while compiling (a C hook would break
 * the graph at every module), so they step aside there and call Hooks.pre / Hooks.post otherwise.
 */
#include "_api_calls.h"
#include <frameobject.h>
/* the attributes read at their slots (_slot_attrs.h) */
SLOT_CACHE(active);
SLOT_CACHE(thread);
SLOT_CACHE(call);
SLOT_CACHE(construct);
SLOT_CACHE(counter);
SLOT_CACHE(counters);
SLOT_CACHE(dump);
SLOT_CACHE(grad_counters);
SLOT_CACHE(index);
SLOT_CACHE(module_path);
SLOT_CACHE(module_stack);
SLOT_CACHE(op);
SLOT_CACHE(parent);
SLOT_CACHE(select_all);
SLOT_CACHE(stack_id);

#define MODULE_HOOKS_ABI 2

/* The context's fields, in order, written once: the enum and the CONTEXT_FIELDS tuple the module exports (the
   Python side builds it by these names, ModuleHooks._c_hooks, and checks them at import: c_contract.py). */
#define CONTEXT(X) X(C_RECORDER, "recorder") X(C_LOCK_ACQUIRE, "lock_acquire") X(C_LOCK_RELEASE, "lock_release") \
    X(C_NOTE_ERROR, "note_error") X(C_ADD_ROWS, "add_rows") X(C_IO_INPUT, "io_input") X(C_IO_OUTPUT, "io_output") \
    X(C_IO_PARAMETERS, "io_parameters") X(C_CALL_TYPE, "call_type") X(C_NO_TORCH_FUNCTION, "no_torch_function") \
    X(C_GRAPH_TASK_ID, "graph_task_id") X(C_WALKED_ID, "walked_id") X(C_SELECTED, "selected") \
    X(C_MODULE_PATHS, "module_paths") X(C_WATCH, "watch_parameters") X(C_PYTHON_PRE, "python_pre") \
    X(C_PYTHON_POST, "python_post") X(C_RECORDS_MODULES, "records_modules") X(C_GRAD_ENABLED, "grad_enabled") \
    X(C_LEAVES, "leaves") X(C_TENSOR, "tensor") X(C_BACKWARD_NAMES, "backward_names") \
    X(C_BACKWARD_OF, "backward_of") X(C_GRAD_WATCH, "grad_watch") X(C_HOOK_TENSOR, "hook_tensor") \
    X(C_PARAM_HOOKS, "param_hooks") X(C_IO_PARAMETERS_GRAD, "io_parameters_grad") \
    X(C_POSITIONS, "positions")
#define AS_ENUM(id, name) id,
#define AS_NAME(id, name) name,
enum { CONTEXT(AS_ENUM) C_SIZE };
static const char *const CONTEXT_NAMES[] = {CONTEXT(AS_NAME)};

static PyObject *s_active, *s_thread, *s_module_stack, *s_counters, *s_select_all, *s_construct, *s_call, *s_dump;
static PyObject *s_stack_id, *s_index, *s_module_path, *s_parameters_attr, *s_name;
static PyObject *s_module, *s_forward, *s_recompute, *s_input, *s_output, *s_parameters, *s_eval_frame;
static PyObject *s_grad_counters, *s_grad, *s_parameters_grad, *s_register_post_accumulate;
static PyObject *s_optimized_module, *s_requires_grad, *s_op, *s_counter, *s_parent, *s_backward, *s_where;
/* tensor attributes read through their getters (_slot_attrs.h) */
GETSET_CACHE(requires_grad);
GETSET_CACHE(grad);

typedef struct {
    PyObject_HEAD
    PyObject *ctx;       /* tuple of C_SIZE objects, in CONTEXT order */
    PyObject *optimized; /* torch._dynamo's OptimizedModule once dynamo is loaded (NULL until then) */
} Hooks;

#define CTX(h, i) PyTuple_GET_ITEM((h)->ctx, (i))

/* The frame that called the hook torch called (its caller's caller here: the Python hook is the current frame),
   as sys._getframe(1) in that hook: a new reference, or None. */
static PyObject *module_frame(void)
{
    PyFrameObject *f = PyEval_GetFrame();
    PyFrameObject *back = f != NULL ? PyFrame_GetBack(f) : NULL;
    return back != NULL ? (PyObject *)back : Py_NewRef(Py_None);
}

/* isinstance(module, OptimizedModule) (compiled._optimized_module: no module is one before dynamo is loaded, and
   dynamo is never imported here): 1, 0, or -1 on error. */
static int compiled(Hooks *h, PyObject *module)
{
    if (h->optimized == NULL) {
        PyObject *mods = PyImport_GetModuleDict();
        PyObject *ef = PyDict_GetItemWithError(mods, s_eval_frame);
        if (ef == NULL)
            return PyErr_Occurred() ? -1 : 0;
        PyObject *cls = PyObject_GetAttr(ef, s_optimized_module);
        if (cls == NULL) { /* dynamo still loading: nothing is compiled yet */
            PyErr_Clear();
            return 0;
        }
        if (!PyType_Check(cls)) {
            Py_DECREF(cls);
            return 0;
        }
        h->optimized = cls;
    }
    return PyObject_TypeCheck(module, (PyTypeObject *)h->optimized);
}

/* The dotted path of a module the recorder has named (Recorder.module_paths): a new reference; NULL without an
   error when the module is new, a root model, or cannot be looked up (the Python hook then finds it). */
static PyObject *known_path(Hooks *h, PyObject *module)
{
    PyObject *ref = PyWeakref_NewRef(module, NULL);
    if (ref == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *path = PyDict_GetItemWithError(CTX(h, C_MODULE_PATHS), ref);
    Py_DECREF(ref);
    if (path == NULL || !PyUnicode_Check(path) || PyUnicode_GET_LENGTH(path) == 0) {
        PyErr_Clear();
        return NULL;
    }
    return Py_NewRef(path);
}

/* Recorder.working() around a hook's body (_api_calls.h), with this recorder's parts */
static int enter_working(Hooks *h, PyObject **off)
{
    return working_off_enter(CTX(h, C_LOCK_ACQUIRE), CTX(h, C_LOCK_RELEASE), CTX(h, C_NO_TORCH_FUNCTION),
                             CTX(h, C_RECORDER), off);
}

static int leave_working(Hooks *h, PyObject *off)
{
    return working_off_leave(CTX(h, C_LOCK_RELEASE), CTX(h, C_RECORDER), off);
}

/* `except Exception as exc: rec.note_error(f"{what} of {type(module).__name__}", exc)` */
static int note(Hooks *h, const char *what, PyObject *module)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *cls = PyObject_GetAttr((PyObject *)Py_TYPE(module), s_name);
    PyObject *where = cls != NULL ? PyUnicode_FromFormat("%s of %S", what, cls) : NULL;
    Py_XDECREF(cls);
    if (where == NULL) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
        return -1;
    }
    PyErr_Restore(et, ev, tb);
    return note_error(CTX(h, C_NOTE_ERROR), where);
}

/* rec.module_stack[-1][1].call, or "" on an empty stack (Recorder.current_parent): a new reference. */
static PyObject *current_parent(PyObject *stack)
{
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (n == 0)
        return Py_NewRef(s_empty);
    PyObject *top = PyList_GET_ITEM(stack, n - 1);
    if (!PyTuple_Check(top) || PyTuple_GET_SIZE(top) != 2) {
        PyErr_SetString(PyExc_TypeError, "Recorder.module_stack holds (module, call) pairs");
        return NULL;
    }
    return SLOT_GET(PyTuple_GET_ITEM(top, 1), call);
}

/* Recorder.selected(name, "Module", cls), without asking it where no scope or list filter is set
   (Recorder._select_all: every call is selected then): 1, 0, or -1 with an exception. */
static int selected(Hooks *h, PyObject *rec, PyObject *name, PyObject *cls)
{
    int all = truth(SLOT_GET(rec, select_all));
    if (all != 0)
        return all;
    PyObject *argv[] = {name, s_module, cls};
    return truth(PyObject_Vectorcall(CTX(h, C_SELECTED), argv, 3, NULL));
}

/* Recorder.open_module(module, path, frame): the module call's Call (a new reference), its counter counted, and
   when it dumps, its stack, index and construct entry. */
static PyObject *open_module(Hooks *h, PyObject *module, PyObject *path, PyObject *frame, PyObject *stack)
{
    PyObject *rec = CTX(h, C_RECORDER);
    PyObject *cls = PyObject_GetAttr((PyObject *)Py_TYPE(module), s_name);
    PyObject *counters = cls != NULL ? SLOT_GET(rec, counters) : NULL;
    PyObject *key = NULL, *name = NULL, *counter = NULL, *next = NULL, *parent = NULL, *c = NULL, *gt = NULL;
    PyObject *text = NULL, *count = NULL;
    if (counters == NULL)
        goto fail;
    if (!PyDict_Check(counters)) {
        PyErr_SetString(PyExc_TypeError, "Recorder.counters must be a dict");
        goto fail;
    }
    text = PyObject_Str(cls); /* the class name itself where it is a str */
    key = text != NULL ? dotted((PyObject *[]){s_module, path, text}, 3) : NULL; /* Recorder.next_counter(f"Module.{path}.{cls}") */
    if (key == NULL)
        goto fail;
    counter = PyDict_GetItemWithError(counters, key);
    if (counter == NULL && PyErr_Occurred())
        goto fail;
    counter = counter != NULL ? Py_NewRef(counter) : Py_NewRef(k_zero);
    next = PyNumber_Add(counter, k_one);
    if (next == NULL || PyDict_SetItem(counters, key, next) < 0)
        goto fail;
    count = count_text(counter);
    name = count != NULL ? dotted((PyObject *[]){key, s_forward, count}, 3) : NULL; /* naming.module_call_name */
    gt = PyObject_CallNoArgs(CTX(h, C_GRAPH_TASK_ID));
    if (name == NULL || gt == NULL)
        goto fail;
    long task = PyLong_AsLong(gt);
    if (task == -1 && PyErr_Occurred())
        PyErr_Clear(); /* -1 as well: not in a backward */
    parent = current_parent(stack);
    if (parent == NULL)
        goto fail;
    PyObject *argv[] = {name, s_module, cls, counter, task != -1 ? s_recompute : s_forward, path, parent};
    c = new_call(CTX(h, C_CALL_TYPE), argv, 7);
    if (c == NULL)
        goto fail;
    int dump = PyObject_IsTrue(CTX(h, C_RECORDS_MODULES));
    if (dump > 0)
        dump = selected(h, rec, name, cls);
    if (dump < 0 || SLOT_SET(c, dump, dump ? Py_True : Py_False) < 0)
        goto fail;
    if (dump) {
        PyObject *sid = call1(CTX(h, C_WALKED_ID), frame);
        int bad = sid == NULL || SLOT_SET(c, stack_id, sid) < 0;
        Py_XDECREF(sid);
        PyObject *idx = bad ? NULL : take_index(rec);
        bad = idx == NULL || SLOT_SET(c, index, idx) < 0;
        Py_XDECREF(idx);
        PyObject *construct = bad ? NULL : SLOT_GET(rec, construct);
        bad = construct == NULL
              || PyObject_SetItem(construct, name, PyUnicode_GET_LENGTH(parent) ? parent : Py_None) < 0;
        Py_XDECREF(construct);
        if (bad)
            goto fail;
    }
    goto done;
fail:
    Py_CLEAR(c);
done:
    Py_XDECREF(cls);
    Py_XDECREF(counters);
    Py_XDECREF(key);
    Py_XDECREF(name);
    Py_XDECREF(counter);
    Py_XDECREF(next);
    Py_XDECREF(parent);
    Py_XDECREF(gt);
    Py_XDECREF(text);
    Py_XDECREF(count);
    return c;
}

/* The pre-hook's body inside working(): open the module's call, its input rows, push it on the stack. */
static int pre_body(Hooks *h, PyObject *module, PyObject *args, PyObject *path, PyObject *frame)
{
    PyObject *rec = CTX(h, C_RECORDER);
    PyObject *stack = SLOT_GET(rec, module_stack);
    if (stack == NULL)
        return -1;
    int failed = -1;
    PyObject *c = NULL, *name = NULL, *pair = NULL;
    if (!PyList_Check(stack)) {
        PyErr_SetString(PyExc_TypeError, "Recorder.module_stack must be a list");
        goto done;
    }
    c = open_module(h, module, path, frame, stack);
    if (c == NULL)
        goto done;
    int dump = truth(SLOT_GET(c, dump));
    if (dump < 0)
        goto done;
    if (dump) {
        name = SLOT_GET(c, call);
        if (name == NULL
            || add_rows_c(rec, CTX(h, C_ADD_ROWS), c, name, s_forward, s_input, CTX(h, C_IO_INPUT), args, s_empty, 0,
                          0) < 0)
            goto done;
    }
    pair = PyTuple_Pack(2, module, c);
    failed = pair == NULL || PyList_Append(stack, pair) < 0 ? -1 : 0;
done:
    Py_DECREF(stack);
    Py_XDECREF(c);
    Py_XDECREF(name);
    Py_XDECREF(pair);
    return failed;
}

/* Whether this module call is the recorded step's: on the thread that called start() (Recorder.thread), or inside
   an autograd graph task, where autograd's own threads (one per device on accelerators) run the step's backward
   and with it the recomputation of checkpointed modules. The module hooks are global, so other threads' modules
   (a data pipeline's transforms, an EMA model) reach them too, and are not recorded; the L1 mode is per thread
   as well. 1, 0, or -1 with an exception set. */
static int on_recording_thread(Hooks *h, PyObject *rec)
{
    PyObject *t = SLOT_GET(rec, thread);
    if (t == NULL)
        return -1;
    unsigned long want = PyLong_AsUnsignedLong(t);
    Py_DECREF(t);
    if (want == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (want == PyThread_get_thread_ident())
        return 1;
    PyObject *task = PyObject_CallNoArgs(CTX(h, C_GRAPH_TASK_ID));
    if (task == NULL)
        return -1;
    long id = PyLong_AsLong(task);
    Py_DECREF(task);
    if (id == -1 && PyErr_Occurred())
        return -1;
    return id != -1;
}

static PyObject *Hooks_pre(Hooks *h, PyObject *const *argv, Py_ssize_t nargs)
{
    if (h->ctx == NULL || nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "Hooks.pre takes (module, args)");
        return NULL;
    }
    PyObject *module = argv[0], *args = argv[1], *rec = CTX(h, C_RECORDER);
    int on = truth(SLOT_GET(rec, active));
    if (on > 0)
        on = on_recording_thread(h, rec);
    if (on <= 0)
        return on < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *frame = module_frame();
    int comp = compiled(h, module);
    PyObject *path = comp == 0 ? known_path(h, module) : NULL;
    if (comp < 0)
        PyErr_Clear();
    if (path == NULL) { /* new, a root, compiled, or not looked up: the Python hook's body */
        PyObject *a[] = {module, args, frame};
        PyObject *r = PyObject_Vectorcall(CTX(h, C_PYTHON_PRE), a, 3, NULL);
        Py_DECREF(frame);
        return r;
    }
    PyObject *off = NULL;
    if (enter_working(h, &off) < 0) {
        Py_DECREF(frame);
        Py_DECREF(path);
        return NULL;
    }
    Py_INCREF(h); /* the hooks may be removed (and freed) by what the body calls */
    int failed = 0;
    if (pre_body(h, module, args, path, frame) < 0)
        failed = note(h, "pre-hook", module) < 0;
    failed |= leave_working(h, off) < 0;
    Py_DECREF(h);
    Py_DECREF(frame);
    Py_DECREF(path);
    return failed ? NULL : Py_NewRef(Py_None);
}

/* module_hooks._pop_module: pop module's entry off the stack with the entries above it and give its call (a new
   reference); NULL without an error when the module has no entry (the stack is left as it is). */
static PyObject *pop_module(PyObject *stack, PyObject *module)
{
    for (Py_ssize_t i = PyList_GET_SIZE(stack) - 1; i >= 0; i--) {
        PyObject *e = PyList_GET_ITEM(stack, i);
        if (PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 2 && PyTuple_GET_ITEM(e, 0) == module) {
            PyObject *c = Py_NewRef(PyTuple_GET_ITEM(e, 1));
            if (PyList_SetSlice(stack, i, PyList_GET_SIZE(stack), NULL) < 0) {
                Py_DECREF(c);
                return NULL;
            }
            return c;
        }
    }
    return NULL;
}

/* {name: p for name, p in module._parameters.items() if p is not None}: a new reference (an empty dict when the
   module has none). */
static PyObject *own_parameters(PyObject *module)
{
    PyObject *params = PyObject_GetAttr(module, s_parameters_attr);
    PyObject *items = params != NULL ? PyMapping_Items(params) : NULL;
    PyObject *out = items != NULL ? PyDict_New() : NULL;
    for (Py_ssize_t i = 0; out != NULL && i < PyList_GET_SIZE(items); i++) {
        PyObject *kv = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(kv) || PyTuple_GET_SIZE(kv) != 2) {
            PyErr_SetString(PyExc_TypeError, "_parameters.items() must give pairs");
            Py_CLEAR(out);
        } else if (PyTuple_GET_ITEM(kv, 1) != Py_None
                   && PyDict_SetItem(out, PyTuple_GET_ITEM(kv, 0), PyTuple_GET_ITEM(kv, 1)) < 0) {
            Py_CLEAR(out);
        }
    }
    Py_XDECREF(params);
    Py_XDECREF(items);
    return out;
}

/* The hook of one tensor in a module call's backward (GradientHooks._grad_hook in C): its gradient is a row of
   each module backward in consumers, a list of (backward call, io, path) that grows as modules see the tensor. */
typedef struct {
    PyObject_HEAD
    Hooks *hooks;
    PyObject *consumers;
} GradHook;

static PyTypeObject GradHookType;

/* The rows of grad for each consumer, inside working(): a module backward's call takes its index (and its
   construct entry) at its first output gradient; an input's gradient before any of them is skipped (that
   module call's outputs take no part in this backward: a forward recomputed by non-reentrant checkpointing
   shares its inputs with the original). */
static int grad_rows(Hooks *h, PyObject *consumers, PyObject *grad)
{
    PyObject *rec = CTX(h, C_RECORDER);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(consumers); i++) {
        PyObject *e = PyList_GET_ITEM(consumers, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 3) {
            PyErr_SetString(PyExc_TypeError, "a tensor's consumers are (call, io, path) triples");
            return -1;
        }
        PyObject *b = PyTuple_GET_ITEM(e, 0), *io = PyTuple_GET_ITEM(e, 1), *path = PyTuple_GET_ITEM(e, 2);
        int is_output = PyUnicode_Check(io) && PyUnicode_Compare(io, s_output) == 0;
        PyObject *index = SLOT_GET(b, index);
        if (index == NULL)
            return -1;
        long idx = PyLong_AsLong(index);
        Py_DECREF(index);
        if (idx == -1 && PyErr_Occurred())
            return -1;
        if (idx < 0 && is_output)
            continue;
        PyObject *name = SLOT_GET(b, call);
        if (name == NULL)
            return -1;
        if (idx < 0) {
            PyObject *taken = take_index(rec);
            int bad = taken == NULL || SLOT_SET(b, index, taken) < 0;
            Py_XDECREF(taken);
            PyObject *parent = bad ? NULL : SLOT_GET(b, parent);
            PyObject *construct = parent != NULL ? SLOT_GET(rec, construct) : NULL;
            int has = parent != NULL ? PyObject_IsTrue(parent) : -1;
            bad = construct == NULL || has < 0 || PyObject_SetItem(construct, name, has ? parent : Py_None) < 0;
            Py_XDECREF(parent);
            Py_XDECREF(construct);
            if (bad) {
                Py_DECREF(name);
                return -1;
            }
        }
        int r = add_rows_c(rec, CTX(h, C_ADD_ROWS), b, name, s_backward, io,
                           CTX(h, is_output ? C_IO_OUTPUT : C_IO_INPUT), grad, path, 0, 0);
        Py_DECREF(name);
        if (r < 0)
            return -1;
    }
    return 0;
}

static PyObject *GradHook_call(GradHook *g, PyObject *args, PyObject *kw)
{
    if (g->hooks == NULL || g->hooks->ctx == NULL || !PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 1
        || (kw != NULL && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "a tensor hook takes (grad)");
        return NULL;
    }
    Hooks *h = g->hooks;
    int on = truth(SLOT_GET(CTX(h, C_RECORDER), active));
    if (on <= 0)
        return on < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *off = NULL;
    if (enter_working(h, &off) < 0)
        return NULL;
    Py_INCREF(g); /* the hook may be removed (and freed) by what it calls */
    Py_INCREF(h);
    int failed = 0;
    if (grad_rows(h, g->consumers, PyTuple_GET_ITEM(args, 0)) < 0) /* never break the user's backward */
        failed = note_error(CTX(h, C_NOTE_ERROR), Py_NewRef(s_where)) < 0;
    failed |= leave_working(h, off) < 0;
    Py_DECREF(h);
    Py_DECREF(g);
    return failed ? NULL : Py_NewRef(Py_None);
}

static int GradHook_traverse(GradHook *g, visitproc visit, void *arg)
{
    Py_VISIT(g->hooks);
    Py_VISIT(g->consumers);
    return 0;
}

static int GradHook_clear(GradHook *g)
{
    Py_CLEAR(g->hooks);
    Py_CLEAR(g->consumers);
    return 0;
}

static void GradHook_dealloc(GradHook *g)
{
    PyObject_GC_UnTrack(g);
    GradHook_clear(g);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

static PyTypeObject GradHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_nb.capture._module_hooks.GradHook",
    .tp_basicsize = sizeof(GradHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A tensor's hook in a module call's backward: its gradient as a row of each consumer.",
    .tp_call = (ternaryfunc)GradHook_call,
    .tp_traverse = (traverseproc)GradHook_traverse,
    .tp_clear = (inquiry)GradHook_clear,
    .tp_dealloc = (destructor)GradHook_dealloc,
};

/* grad_leaves for an exact list or tuple, no longer than leaves.POSITIONS, none of whose items is a list, tuple or
   dict (a module's usual arguments and outputs), where leaves() gives each item as itself at its position: a new
   list, or NULL without an exception set for any other value (leaves() walks it). */
static PyObject *flat_grad_leaves(Hooks *h, PyObject *value)
{
    PyObject *positions = CTX(h, C_POSITIONS);
    if (!PyList_CheckExact(value) && !PyTuple_CheckExact(value))
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(value);
    if (n > PyTuple_GET_SIZE(positions))
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(value, i);
        if (PyList_Check(item) || PyTuple_Check(item) || PyDict_Check(item))
            return NULL;
    }
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < PyTuple_GET_SIZE(positions) && i < PySequence_Fast_GET_SIZE(value);
         i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(value, i); /* borrowed: the list may change under a getter */
        Py_INCREF(t);
        int keep = PyObject_IsInstance(t, CTX(h, C_TENSOR));
        if (keep > 0)
            keep = truth(GETSET_GET(t, requires_grad));
        PyObject *pair = keep > 0 ? PyTuple_Pack(2, PyTuple_GET_ITEM(positions, i), t) : NULL;
        if (keep < 0 || (keep > 0 && (pair == NULL || PyList_Append(out, pair) < 0)))
            Py_CLEAR(out);
        Py_XDECREF(pair);
        Py_DECREF(t);
    }
    return out; /* NULL only with the exception that cleared it set */
}

/* [(path, t) for path, t in leaves(value) if isinstance(t, torch.Tensor) and t.requires_grad]: a new list. */
static PyObject *grad_leaves(Hooks *h, PyObject *value)
{
    PyObject *flat = flat_grad_leaves(h, value);
    if (flat != NULL || PyErr_Occurred())
        return flat;
    PyObject *all = call1(CTX(h, C_LEAVES), value);
    if (all == NULL)
        return NULL;
    PyObject *out = PyList_Check(all) ? PyList_New(0) : NULL;
    if (out == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "leaves() must give a list");
        Py_DECREF(all);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(all); i++) {
        PyObject *pair = PyList_GET_ITEM(all, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "leaves() must give (path, leaf) pairs");
            Py_CLEAR(out);
            break;
        }
        PyObject *t = PyTuple_GET_ITEM(pair, 1);
        int keep = PyObject_IsInstance(t, CTX(h, C_TENSOR));
        if (keep > 0)
            keep = truth(GETSET_GET(t, requires_grad));
        if (keep < 0 || (keep && PyList_Append(out, pair) < 0)) {
            Py_CLEAR(out);
            break;
        }
    }
    Py_DECREF(all);
    return out;
}

/* GradientHooks.backward_of(call): the cached backward name of a forward call (a new reference). */
static PyObject *backward_of(Hooks *h, PyObject *call)
{
    return cached(CTX(h, C_BACKWARD_NAMES), CTX(h, C_BACKWARD_OF), call);
}

/* One consumer more for tensor t: its hook made (and its watch entry) on first sight this step. */
static int consume(Hooks *h, PyObject *t, PyObject *entry)
{
    PyObject *watched = CTX(h, C_GRAD_WATCH), *key = PyLong_FromVoidPtr(t), *consumers = NULL;
    if (key == NULL)
        return -1;
    int failed = -1;
    PyObject *hit = PyDict_GetItemWithError(watched, key);
    if (hit == NULL && PyErr_Occurred())
        goto done;
    if (hit != NULL && PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == 2 && PyWeakref_Check(PyTuple_GET_ITEM(hit, 0))
        && PyWeakref_GetObject(PyTuple_GET_ITEM(hit, 0)) == t) {
        consumers = Py_NewRef(PyTuple_GET_ITEM(hit, 1));
    } else {
        consumers = PyList_New(0);
        GradHook *g = consumers != NULL ? PyObject_GC_New(GradHook, &GradHookType) : NULL;
        if (g == NULL)
            goto done;
        g->hooks = (Hooks *)Py_NewRef(h);
        g->consumers = Py_NewRef(consumers);
        PyObject_GC_Track(g);
        PyObject *r = call2(CTX(h, C_HOOK_TENSOR), t, (PyObject *)g);
        Py_DECREF(g);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
        PyObject *ref = PyWeakref_NewRef(t, NULL);
        PyObject *w = ref != NULL ? PyTuple_Pack(2, ref, consumers) : NULL;
        Py_XDECREF(ref);
        int bad = w == NULL || PyDict_SetItem(watched, key, w) < 0;
        Py_XDECREF(w);
        if (bad)
            goto done;
    }
    if (!PyList_Check(consumers)) {
        PyErr_SetString(PyExc_TypeError, "a watched tensor's consumers must be a list");
        goto done;
    }
    failed = PyList_Append(consumers, entry);
done:
    Py_DECREF(key);
    Py_XDECREF(consumers);
    return failed;
}

/* GradientHooks.attach_module_backward(c, args, output) for a call that dumps (outs: the output as its rows
   took it): one tensor hook per output and input that requires grad, shared by every module that sees it. */
static int attach(Hooks *h, PyObject *c, PyObject *name, PyObject *args, PyObject *outs)
{
    int on = truth(PyObject_CallNoArgs(CTX(h, C_GRAD_ENABLED)));
    if (on <= 0)
        return on;
    PyObject *o = grad_leaves(h, outs), *in = NULL, *bname = NULL, *parent = NULL, *b = NULL;
    PyObject *op = NULL, *counter = NULL, *mpath = NULL, *sid = NULL;
    int failed = -1;
    if (o == NULL)
        return -1;
    if (PyList_GET_SIZE(o) == 0) {
        failed = 0;
        goto done;
    }
    in = grad_leaves(h, args);
    bname = in != NULL ? backward_of(h, name) : NULL;
    parent = bname != NULL ? SLOT_GET(c, parent) : NULL;
    if (parent == NULL)
        goto done;
    int has = PyObject_IsTrue(parent);
    if (has < 0)
        goto done;
    Py_SETREF(parent, has ? backward_of(h, parent) : Py_NewRef(s_empty));
    op = parent != NULL ? SLOT_GET(c, op) : NULL;
    counter = op != NULL ? SLOT_GET(c, counter) : NULL;
    mpath = counter != NULL ? SLOT_GET(c, module_path) : NULL;
    sid = mpath != NULL ? SLOT_GET(c, stack_id) : NULL;
    if (sid == NULL)
        goto done;
    PyObject *argv[] = {bname, s_module, op, counter, s_backward, mpath, parent, sid};
    b = new_call(CTX(h, C_CALL_TYPE), argv, 8);
    if (b == NULL)
        goto done;
    PyObject *sides[2][2] = {{s_input, o}, {s_output, in}};
    for (int s = 0; s < 2; s++) {
        PyObject *items = sides[s][1];
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
            PyObject *pair = PyList_GET_ITEM(items, i);
            PyObject *entry = PyTuple_Pack(3, b, sides[s][0], PyTuple_GET_ITEM(pair, 0));
            int bad = entry == NULL || consume(h, PyTuple_GET_ITEM(pair, 1), entry) < 0;
            Py_XDECREF(entry);
            if (bad)
                goto done;
        }
    }
    failed = 0;
done:
    Py_DECREF(o);
    Py_XDECREF(in);
    Py_XDECREF(bname);
    Py_XDECREF(parent);
    Py_XDECREF(b);
    Py_XDECREF(op);
    Py_XDECREF(counter);
    Py_XDECREF(mpath);
    Py_XDECREF(sid);
    return failed;
}

/* A parameter's post-accumulate-grad hook (GradientHooks._param_grad_hook in C): its gradient as the row of the
   module's parameters_grad call, one call per module and firing, shared by the module's parameters. */
typedef struct {
    PyObject_HEAD
    Hooks *hooks;
    PyObject *path, *cls, *pname;
    PyObject *key;   /* f"{path}.{cls}.{pname}": the parameter's firing counter in Recorder.grad_counters */
    PyObject *where; /* what a failure is noted as */
} ParamHook;

static PyTypeObject ParamHookType;

/* record_grad(p), inside working() */
static int param_rows(ParamHook *ph, PyObject *grad)
{
    Hooks *h = ph->hooks;
    PyObject *rec = CTX(h, C_RECORDER);
    PyObject *counters = SLOT_GET(rec, grad_counters);
    PyObject *k = NULL, *next = NULL, *name = NULL, *index = NULL, *c = NULL, *value = NULL;
    int failed = -1;
    if (counters == NULL)
        return -1;
    if (!PyDict_Check(counters)) {
        PyErr_SetString(PyExc_TypeError, "Recorder.grad_counters must be a dict");
        goto done;
    }
    k = PyDict_GetItemWithError(counters, ph->key);
    if (k == NULL && PyErr_Occurred())
        goto done;
    k = Py_NewRef(k != NULL ? k : k_zero);
    next = PyNumber_Add(k, k_one);
    if (next == NULL || PyDict_SetItem(counters, ph->key, next) < 0)
        goto done;
    PyObject *count = count_text(k);
    name = count != NULL ? dotted((PyObject *[]){s_module, ph->path, ph->cls, s_parameters_grad, count}, 5) : NULL;
    Py_XDECREF(count);
    if (name == NULL)
        goto done;
    index = PyDict_GetItemWithError(counters, name); /* one call per module and firing: its parameters share it */
    if (index == NULL && PyErr_Occurred())
        goto done;
    if (index != NULL)
        Py_INCREF(index);
    else if ((index = take_index(rec)) == NULL || PyDict_SetItem(counters, name, index) < 0)
        goto done;
    PyObject *argv[] = {name, s_module, ph->cls, k, s_parameters_grad, ph->path, s_empty, k_minus_one, index};
    c = new_call(CTX(h, C_CALL_TYPE), argv, 9);
    if (c == NULL)
        goto done;
    int dump = selected(h, rec, name, ph->cls);
    if (dump < 0 || SLOT_SET(c, dump, dump ? Py_True : Py_False) < 0)
        goto done;
    if (dump) {
        value = PyDict_New();
        if (value == NULL || PyDict_SetItem(value, ph->pname, grad) < 0
            || add_rows_base(rec, CTX(h, C_ADD_ROWS), c, name, name, s_parameters_grad, s_parameters_grad,
                             CTX(h, C_IO_PARAMETERS_GRAD), value, s_empty, 0, 0) < 0)
            goto done;
    }
    failed = 0;
done:
    Py_DECREF(counters);
    Py_XDECREF(k);
    Py_XDECREF(next);
    Py_XDECREF(name);
    Py_XDECREF(index);
    Py_XDECREF(c);
    Py_XDECREF(value);
    return failed;
}

static PyObject *ParamHook_call(ParamHook *ph, PyObject *args, PyObject *kw)
{
    if (ph->hooks == NULL || ph->hooks->ctx == NULL || !PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 1
        || (kw != NULL && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "a parameter's gradient hook takes (param)");
        return NULL;
    }
    Hooks *h = ph->hooks;
    int on = truth(SLOT_GET(CTX(h, C_RECORDER), active));
    if (on <= 0)
        return on < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *grad = GETSET_GET(PyTuple_GET_ITEM(args, 0), grad);
    if (grad == NULL || grad == Py_None) {
        if (grad == NULL)
            return NULL;
        Py_DECREF(grad);
        return Py_NewRef(Py_None);
    }
    PyObject *off = NULL;
    if (enter_working(h, &off) < 0) {
        Py_DECREF(grad);
        return NULL;
    }
    Py_INCREF(ph);
    Py_INCREF(h);
    int failed = 0;
    if (param_rows(ph, grad) < 0) /* never break the user's backward */
        failed = note_error(CTX(h, C_NOTE_ERROR), Py_NewRef(ph->where)) < 0;
    failed |= leave_working(h, off) < 0;
    Py_DECREF(h);
    Py_DECREF(ph);
    Py_DECREF(grad);
    return failed ? NULL : Py_NewRef(Py_None);
}

static int ParamHook_traverse(ParamHook *ph, visitproc visit, void *arg)
{
    Py_VISIT(ph->hooks);
    return 0;
}

static int ParamHook_clear(ParamHook *ph)
{
    Py_CLEAR(ph->hooks);
    Py_CLEAR(ph->path);
    Py_CLEAR(ph->cls);
    Py_CLEAR(ph->pname);
    Py_CLEAR(ph->key);
    Py_CLEAR(ph->where);
    return 0;
}

static void ParamHook_dealloc(ParamHook *ph)
{
    PyObject_GC_UnTrack(ph);
    ParamHook_clear(ph);
    Py_TYPE(ph)->tp_free((PyObject *)ph);
}

static PyTypeObject ParamHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_nb.capture._module_hooks.ParamHook",
    .tp_basicsize = sizeof(ParamHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A parameter's gradient hook: its gradient as a row of the module's parameters_grad call.",
    .tp_call = (ternaryfunc)ParamHook_call,
    .tp_traverse = (traverseproc)ParamHook_traverse,
    .tp_clear = (inquiry)ParamHook_clear,
    .tp_dealloc = (destructor)ParamHook_dealloc,
};

/* GradientHooks.watch_parameters(module, path) at L0 and mix: a post-accumulate hook per parameter of the module
   that requires grad and has none yet (removed when recording stops). */
static int watch_parameters(Hooks *h, PyObject *module, PyObject *path)
{
    PyObject *params = PyObject_GetAttr(module, s_parameters_attr);
    if (params == NULL)
        return -1;
    if (!PyDict_Check(params)) { /* not an nn.Module's dict: GradientHooks.watch_parameters itself */
        Py_DECREF(params);
        PyObject *r = call2(CTX(h, C_WATCH), module, path);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    PyObject *hooks = CTX(h, C_PARAM_HOOKS), *cls = NULL, *pname, *p;
    Py_ssize_t pos = 0;
    int failed = 0;
    while (!failed && PyDict_Next(params, &pos, &pname, &p)) {
        if (p == Py_None)
            continue;
        PyObject *key = PyLong_FromVoidPtr(p);
        int has = key != NULL ? PyDict_Contains(hooks, key) : -1;
        int rg = has == 0 ? truth(GETSET_GET(p, requires_grad)) : 0;
        if (has < 0 || rg < 0) {
            Py_XDECREF(key);
            failed = 1;
            break;
        }
        if (!rg) {
            Py_DECREF(key);
            continue;
        }
        if (cls == NULL && (cls = PyObject_GetAttr((PyObject *)Py_TYPE(module), s_name)) == NULL) {
            Py_DECREF(key);
            failed = 1;
            break;
        }
        Py_INCREF(pname); /* held across Python calls: the dict may change under them */
        Py_INCREF(p);
        ParamHook *ph = PyObject_GC_New(ParamHook, &ParamHookType);
        if (ph != NULL) {
            ph->hooks = (Hooks *)Py_NewRef(h);
            ph->path = Py_NewRef(path);
            ph->cls = Py_NewRef(cls);
            ph->pname = Py_NewRef(pname);
            ph->key = PyUnicode_FromFormat("%U.%U.%S", path, cls, pname);
            ph->where = PyUnicode_FromFormat("the gradient of %U.%S", path, pname);
            PyObject_GC_Track(ph);
        }
        PyObject *handle = ph != NULL && ph->key != NULL && ph->where != NULL
                           ? PyObject_CallMethodOneArg(p, s_register_post_accumulate, (PyObject *)ph) : NULL;
        failed = handle == NULL || PyDict_SetItem(hooks, key, handle) < 0;
        Py_XDECREF(handle);
        Py_XDECREF(ph);
        Py_DECREF(key);
        Py_DECREF(pname);
        Py_DECREF(p);
    }
    Py_XDECREF(cls);
    Py_DECREF(params);
    return failed ? -1 : 0;
}

/* The forward hook's body inside working(): pop the module's call; for a forward that returned, its keyword
   inputs, outputs and parameters as rows, the hooks of its backward, and its parameters' gradient hooks. */
static int post_body(Hooks *h, PyObject *const *argv, Py_ssize_t nargs, PyObject *stack)
{
    PyObject *rec = CTX(h, C_RECORDER), *module = argv[0];
    PyObject *c = pop_module(stack, module);
    if (c == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int failed = -1;
    PyObject *name = NULL, *outs = NULL, *params = NULL, *mpath = NULL;
    int on = nargs == 4 ? truth(SLOT_GET(rec, active)) : 0;
    if (on <= 0) {
        failed = on;
        goto done;
    }
    name = SLOT_GET(c, call);
    if (name == NULL || !PyUnicode_Check(name)) {
        if (name != NULL)
            PyErr_SetString(PyExc_TypeError, "a Call's name must be a string");
        goto done;
    }
    if (PyUnicode_GET_LENGTH(name) == 0) { /* a root model's entry */
        failed = 0;
        goto done;
    }
    PyObject *args = argv[1], *kwargs = argv[2], *output = argv[3];
    int dump = truth(SLOT_GET(c, dump));
    if (dump < 0)
        goto done;
    if (dump) {
        int has_kwargs = PyObject_IsTrue(kwargs);
        if (has_kwargs < 0)
            goto done;
        if (has_kwargs && add_rows_c(rec, CTX(h, C_ADD_ROWS), c, name, s_forward, s_input, CTX(h, C_IO_INPUT), kwargs,
                                     s_empty, 1, 0) < 0)
            goto done;
        if (PyTuple_Check(output) || PyList_Check(output) || PyDict_Check(output))
            outs = Py_NewRef(output);
        else
            outs = PyList_New(1);
        if (outs == NULL)
            goto done;
        if (outs != output)
            PyList_SET_ITEM(outs, 0, Py_NewRef(output));
        if (add_rows_c(rec, CTX(h, C_ADD_ROWS), c, name, s_forward, s_output, CTX(h, C_IO_OUTPUT), outs, s_empty, 0,
                       1) < 0)
            goto done;
        params = own_parameters(module);
        if (params == NULL)
            goto done;
        if (PyDict_GET_SIZE(params)
            && add_rows_c(rec, CTX(h, C_ADD_ROWS), c, name, s_forward, s_parameters, CTX(h, C_IO_PARAMETERS), params,
                          s_empty, 0, 0) < 0)
            goto done;
        if (attach(h, c, name, args, outs) < 0)
            goto done;
    }
    int watch = PyObject_IsTrue(CTX(h, C_RECORDS_MODULES)); /* parameter gradients: L0 and mix */
    if (watch < 0)
        goto done;
    mpath = watch ? SLOT_GET(c, module_path) : NULL;
    failed = watch && (mpath == NULL || watch_parameters(h, module, mpath) < 0) ? -1 : 0;
done:
    Py_DECREF(c);
    Py_XDECREF(name);
    Py_XDECREF(outs);
    Py_XDECREF(params);
    Py_XDECREF(mpath);
    return failed;
}

static PyObject *Hooks_post(Hooks *h, PyObject *const *argv, Py_ssize_t nargs)
{
    if (h->ctx == NULL || nargs < 2) {
        PyErr_SetString(PyExc_TypeError, "Hooks.post takes (module, args, *rest)");
        return NULL;
    }
    PyObject *module = argv[0], *rec = CTX(h, C_RECORDER);
    PyObject *stack = SLOT_GET(rec, module_stack);
    if (stack == NULL)
        return NULL;
    if (!PyList_Check(stack) || PyList_GET_SIZE(stack) == 0) { /* `if not rec.module_stack: return None` */
        int empty = PyList_Check(stack) ? 1 : !PyObject_IsTrue(stack);
        Py_DECREF(stack);
        if (empty)
            return Py_NewRef(Py_None);
        return PyObject_Vectorcall(CTX(h, C_PYTHON_POST), argv, nargs, NULL);
    }
    int mine = on_recording_thread(h, rec); /* another thread's module: its pre-hook pushed nothing to pop */
    if (mine <= 0) {
        Py_DECREF(stack);
        return mine < 0 ? NULL : Py_NewRef(Py_None);
    }
    int comp = compiled(h, module);
    if (comp != 0) { /* a torch.compile wrapper (or it could not be told): the Python hook's body */
        if (comp < 0)
            PyErr_Clear();
        Py_DECREF(stack);
        return PyObject_Vectorcall(CTX(h, C_PYTHON_POST), argv, nargs, NULL);
    }
    PyObject *off = NULL;
    if (enter_working(h, &off) < 0) {
        Py_DECREF(stack);
        return NULL;
    }
    Py_INCREF(h);
    int failed = 0;
    if (post_body(h, argv, nargs, stack) < 0)
        failed = note(h, "forward hook", module) < 0;
    failed |= leave_working(h, off) < 0;
    Py_DECREF(h);
    Py_DECREF(stack);
    return failed ? NULL : Py_NewRef(Py_None);
}

static PyObject *Hooks_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *ctx = context_arg(args, kw, C_SIZE, "Hooks");
    if (ctx == NULL)
        return NULL;
    if (!PyDict_Check(PyTuple_GET_ITEM(ctx, C_MODULE_PATHS)) || !PyDict_Check(PyTuple_GET_ITEM(ctx, C_BACKWARD_NAMES))
        || !PyDict_Check(PyTuple_GET_ITEM(ctx, C_GRAD_WATCH)) || !PyDict_Check(PyTuple_GET_ITEM(ctx, C_PARAM_HOOKS))
        || !PyTuple_Check(PyTuple_GET_ITEM(ctx, C_POSITIONS))) {
        PyErr_SetString(PyExc_TypeError, "Hooks: module_paths, backward_names, grad_watch and param_hooks must be "
                                         "dicts, positions a tuple");
        return NULL;
    }
    Hooks *h = (Hooks *)type->tp_alloc(type, 0);
    if (h == NULL)
        return NULL;
    h->ctx = Py_NewRef(ctx);
    return (PyObject *)h;
}

static int Hooks_traverse(Hooks *h, visitproc visit, void *arg)
{
    Py_VISIT(h->ctx);
    Py_VISIT(h->optimized);
    return 0;
}

static int Hooks_clear(Hooks *h)
{
    Py_CLEAR(h->ctx);
    Py_CLEAR(h->optimized);
    return 0;
}

static void Hooks_dealloc(Hooks *h)
{
    PyObject_GC_UnTrack(h);
    Hooks_clear(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyMethodDef Hooks_methods[] = {
    {"pre", (PyCFunction)(void (*)(void))Hooks_pre, METH_FASTCALL,
     "pre(module, args): ModuleHooks._pre's work past its compile check."},
    {"post", (PyCFunction)(void (*)(void))Hooks_post, METH_FASTCALL,
     "post(module, args, kwargs, output) or post(module, args, result): ModuleHooks._post's work past its compile "
     "check."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject HooksType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_nb.capture._module_hooks.Hooks",
    .tp_basicsize = sizeof(Hooks),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Hooks(ctx): the global module hooks' work for one recorder (ctx: CONTEXT_FIELDS, in order).",
    .tp_new = Hooks_new,
    .tp_traverse = (traverseproc)Hooks_traverse,
    .tp_clear = (inquiry)Hooks_clear,
    .tp_dealloc = (destructor)Hooks_dealloc,
    .tp_methods = Hooks_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_module_hooks",
                                    "The global module hooks' work, in C.", -1, NULL, NULL, NULL, NULL, NULL};

#define INTERN API_INTERN

PyMODINIT_FUNC PyInit__module_hooks(void)
{
    if (api_calls_init() < 0 || INTERN(s_active, "active") || INTERN(s_thread, "thread")
        || INTERN(s_module_stack, "module_stack") || INTERN(s_counters, "counters")
        || INTERN(s_select_all, "_select_all") || INTERN(s_construct, "construct")
        || INTERN(s_call, "call") || INTERN(s_dump, "dump") || INTERN(s_stack_id, "stack_id")
        || INTERN(s_index, "index") || INTERN(s_module_path, "module_path") || INTERN(s_parameters_attr, "_parameters")
        || INTERN(s_name, "__name__")
        || INTERN(s_module, "Module") || INTERN(s_forward, "forward") || INTERN(s_recompute, "recompute")
        || INTERN(s_input, "input") || INTERN(s_output, "output") || INTERN(s_parameters, "parameters")
        || INTERN(s_eval_frame, "torch._dynamo.eval_frame") || INTERN(s_optimized_module, "OptimizedModule")
        || INTERN(s_requires_grad, "requires_grad") || INTERN(s_op, "op") || INTERN(s_counter, "counter")
        || INTERN(s_parent, "parent") || INTERN(s_backward, "backward") || INTERN(s_where, "a module backward")
        || INTERN(s_grad_counters, "grad_counters") || INTERN(s_grad, "grad")
        || INTERN(s_parameters_grad, "parameters_grad")
        || INTERN(s_register_post_accumulate, "register_post_accumulate_grad_hook"))
        return NULL;
    if (PyType_Ready(&HooksType) < 0 || PyType_Ready(&GradHookType) < 0 || PyType_Ready(&ParamHookType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (add_layout(m, MODULE_HOOKS_ABI, CONTEXT_NAMES, C_SIZE, "Hooks", &HooksType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
