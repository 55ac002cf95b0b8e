/* One API call's backward, in C: api_backward.CallGraph.of, BackwardRows and their node hooks.
 *
 * Why: every recorded call whose inputs need gradients walks its autograd subgraph right after its forward and
 * hooks the nodes it made; each hook then turns the gradients autograd hands it into the call's backward rows.
 * In Python the walk, the per-node closures and the hook's glue cost tens of microseconds per call. Here
 * Attacher.attach does the walk and hooks each node with a NodeHook (a C callable), and the hook does what
 * BackwardRows.on_node does, reaching Python only for the row builder, a shared summary, the node's
 * register_hook and a failure's note. api_backward.py stays as the fallback and the reference: the rows, names,
 * counters and indices are the same (tests/test_api_handler.py diffs whole dumps of both paths).
 */
#include "_api_calls.h"
/* the attributes read at their slots (_slot_attrs.h) */
SLOT_CACHE(active);
SLOT_CACHE(backward_epoch);
SLOT_CACHE(call);
SLOT_CACHE(construct);
SLOT_CACHE(counter);
SLOT_CACHE(family);
SLOT_CACHE(module_path);
SLOT_CACHE(op);
SLOT_CACHE(parent);
SLOT_CACHE(stack_id);

#define API_BACKWARD_ABI 2

/* The context's fields, in order (GradientHooks builds it by these names, checked at import: c_contract.py). */
#define CONTEXT(X) X(C_RECORDER, "recorder") X(C_LOCK_ACQUIRE, "lock_acquire") X(C_LOCK_RELEASE, "lock_release") \
    X(C_NOTE_ERROR, "note_error") X(C_ADD_ROWS, "add_rows") X(C_IO_INPUT, "io_input") X(C_IO_OUTPUT, "io_output") \
    X(C_CALL_TYPE, "call_type") X(C_SHARE_SUMMARY, "share_summary") X(C_TENSOR, "tensor") \
    X(C_ACCUMULATE_GRAD, "accumulate_grad") X(C_LEAVES, "leaves") X(C_NO_TORCH_FUNCTION, "no_torch_function") \
    X(C_SAME_ELEMENTS, "same_elements") X(C_MAX_NODES, "max_nodes") \
    X(C_BACKWARD_NAME, "backward_name") X(C_BACKWARD_NAMES, "backward_names") X(C_BACKWARD_OF, "backward_of")
#define AS_ENUM(id, name) id,
#define AS_NAME(id, name) name,
enum { CONTEXT(AS_ENUM) C_SIZE };
static const char *const CONTEXT_NAMES[] = {CONTEXT(AS_NAME)};
#define CTX(ctx, i) PyTuple_GET_ITEM((ctx), (i))

static PyObject *s_active, *s_backward_epoch, *s_grad_fn, *s_output_nr, *s_sequence_nr, *s_next_functions;
static PyObject *s_variable, *s_register_hook;
static PyObject *s_family, *s_op, *s_counter, *s_module_path, *s_stack_id, *s_construct, *s_backward, *s_input;
static PyObject *s_output, *s_detach, *s_clone, *s_zero_path, *s_where, *s_call;
static PyObject *s_parent, *s_dot_forward;
/* tensor attributes read through their getters (_slot_attrs.h) */
GETSET_CACHE(grad_fn);
GETSET_CACHE(output_nr);

/* ------------------------------------------------------------------ the backward of one call */
typedef struct {
    PyObject_HEAD
    PyObject *ctx;                               /* the Attacher's context tuple */
    PyObject *bname, *family, *op, *counter, *module_path, *parent, *stack_id; /* the backward Call's fields */
    PyObject *paths;                             /* tuple: each input's row path */
    PyObject *counts;                            /* tuple of ints: edges that carry each input's gradient */
    PyObject *call;                              /* the backward Call once its first node ran, else NULL */
    PyObject *acc;                               /* dict: input -> the gradient summed so far */
    PyObject *epoch;                             /* the recorder's backward_epoch when the call was recorded */
    Py_ssize_t *pending;                         /* per input: edges still to come */
    Py_ssize_t ninputs, nodes, left;
    int share;                                   /* the call keeps its input's elements: gradients share summaries */
} Rows;

static int rows_reset(Rows *r)
{
    Py_CLEAR(r->call);
    for (Py_ssize_t j = 0; j < r->ninputs; j++) {
        r->pending[j] = PyLong_AsSsize_t(PyTuple_GET_ITEM(r->counts, j));
        if (r->pending[j] == -1 && PyErr_Occurred())
            return -1;
    }
    PyDict_Clear(r->acc);
    r->left = r->nodes;
    return 0;
}

static int Rows_traverse(Rows *r, visitproc visit, void *arg)
{
    Py_VISIT(r->ctx);
    Py_VISIT(r->call);
    Py_VISIT(r->acc);
    Py_VISIT(r->epoch);
    return 0;
}

static int Rows_clear(Rows *r)
{
    Py_CLEAR(r->ctx);
    Py_CLEAR(r->bname);
    Py_CLEAR(r->family);
    Py_CLEAR(r->op);
    Py_CLEAR(r->counter);
    Py_CLEAR(r->module_path);
    Py_CLEAR(r->parent);
    Py_CLEAR(r->stack_id);
    Py_CLEAR(r->paths);
    Py_CLEAR(r->counts);
    Py_CLEAR(r->call);
    Py_CLEAR(r->acc);
    Py_CLEAR(r->epoch);
    return 0;
}

static void Rows_dealloc(Rows *r)
{
    PyObject_GC_UnTrack(r);
    Rows_clear(r);
    PyMem_Free(r->pending);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyTypeObject RowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_nb.capture._api_backward.Rows",
    .tp_basicsize = sizeof(Rows),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The backward rows of one recorded call (api_backward.BackwardRows).",
    .tp_traverse = (traverseproc)Rows_traverse,
    .tp_clear = (inquiry)Rows_clear,
    .tp_dealloc = (destructor)Rows_dealloc,
};

/* The backward Call, made when the first of the call's nodes runs (so its index is where its backward begins). */
static PyObject *open_call(Rows *r)
{
    PyObject *rec = CTX(r->ctx, C_RECORDER);
    PyObject *idx = take_index(rec);
    if (idx == NULL)
        return NULL;
    PyObject *argv[] = {r->bname, r->family, r->op, r->counter, s_backward, r->module_path, r->parent, r->stack_id,
                        idx};
    PyObject *b = new_call(CTX(r->ctx, C_CALL_TYPE), argv, 9);
    Py_DECREF(idx);
    if (b == NULL)
        return NULL;
    int has_parent = PyObject_IsTrue(r->parent);
    if (has_parent > 0) {
        PyObject *construct = SLOT_GET(rec, construct);
        has_parent = construct == NULL || PyObject_SetItem(construct, r->bname, r->parent) < 0 ? -1 : 0;
        Py_XDECREF(construct);
    }
    if (has_parent < 0)
        Py_CLEAR(b);
    return b;
}

/* rec.add_rows(call, "backward", io, value, prefix=prefix) */
static int rows_of(Rows *r, int output, PyObject *value, PyObject *prefix)
{
    PyObject *name = SLOT_GET(r->call, call);
    if (name == NULL)
        return -1;
    int failed = add_rows_c(CTX(r->ctx, C_RECORDER), CTX(r->ctx, C_ADD_ROWS), r->call, name, s_backward,
                            output ? s_output : s_input, CTX(r->ctx, output ? C_IO_OUTPUT : C_IO_INPUT), value, prefix,
                            0, 0);
    Py_DECREF(name);
    return failed;
}

/* item i of a hook's gradients (a tuple from autograd), or None past its end */
static PyObject *grad_at(PyObject *grads, Py_ssize_t i)
{
    Py_ssize_t n = PySequence_Size(grads);
    if (n < 0)
        return NULL;
    return i < n ? PySequence_GetItem(grads, i) : Py_NewRef(Py_None);
}

/* BackwardRows._emit: input j's gradient g is complete; with the node's single output, a view's gradient shares
   the output gradient's summary. */
static int emit(Rows *r, Py_ssize_t j, PyObject *g, PyObject *outs, PyObject *grad_outputs)
{
    if (r->share && outs != NULL && PyTuple_GET_SIZE(outs) == 1) {
        Py_ssize_t nr = PyLong_AsSsize_t(PyTuple_GET_ITEM(PyTuple_GET_ITEM(outs, 0), 1));
        if (nr == -1 && PyErr_Occurred())
            return -1;
        PyObject *go = PySequence_GetItem(grad_outputs, nr);
        if (go == NULL)
            return -1;
        int is = PyObject_IsInstance(go, CTX(r->ctx, C_TENSOR));
        PyObject *res = is > 0 ? call2(CTX(r->ctx, C_SHARE_SUMMARY), g, go) : NULL;
        Py_DECREF(go);
        if (is < 0 || (is > 0 && res == NULL))
            return -1;
        Py_XDECREF(res);
    }
    return rows_of(r, 1, g, PyTuple_GET_ITEM(r->paths, j));
}

/* BackwardRows.on_node: the rows one node's gradients give (outs: its outputs' (path, nr); edges: (i, input)). */
static int on_node(Rows *r, PyObject *outs, PyObject *edges, PyObject *grad_inputs, PyObject *grad_outputs)
{
    if (r->call == NULL && (r->call = open_call(r)) == NULL)
        return -1;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(outs); k++) {
        PyObject *pair = PyTuple_GET_ITEM(outs, k);
        Py_ssize_t nr = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1));
        if (nr == -1 && PyErr_Occurred())
            return -1;
        PyObject *g = grad_at(grad_outputs, nr);
        int failed = g == NULL || rows_of(r, 0, g, PyTuple_GET_ITEM(pair, 0)) < 0;
        Py_XDECREF(g);
        if (failed)
            return -1;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(edges); k++) {
        PyObject *pair = PyTuple_GET_ITEM(edges, k);
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0)), j = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1));
        if ((i == -1 || j == -1) && PyErr_Occurred())
            return -1;
        if (j < 0 || j >= r->ninputs) {
            PyErr_SetString(PyExc_IndexError, "an API backward's edge names no input");
            return -1;
        }
        PyObject *g = grad_at(grad_inputs, i), *key = PyLong_FromSsize_t(j);
        if (g == NULL || key == NULL) {
            Py_XDECREF(g);
            Py_XDECREF(key);
            return -1;
        }
        r->pending[j] -= 1;
        int failed = 0;
        if (g != Py_None) {
            int held = PyDict_Contains(r->acc, key);
            if (held < 0) {
                failed = 1;
            } else if (r->pending[j] == 0 && !held) { /* the only (or last, first) edge: no copy */
                failed = emit(r, j, g, outs, grad_outputs) < 0;
                Py_DECREF(g);
                Py_DECREF(key);
                if (failed)
                    return -1;
                continue;
            } else {
                PyObject *prev = PyDict_GetItemWithError(r->acc, key), *sum = NULL;
                if (prev == NULL && !PyErr_Occurred()) {
                    PyObject *d = PyObject_CallMethodNoArgs(g, s_detach);
                    sum = d != NULL ? PyObject_CallMethodNoArgs(d, s_clone) : NULL;
                    Py_XDECREF(d);
                } else if (prev != NULL) {
                    sum = PyNumber_Add(prev, g);
                }
                failed = sum == NULL || PyDict_SetItem(r->acc, key, sum) < 0;
                Py_XDECREF(sum);
            }
        }
        Py_DECREF(g);
        if (!failed && r->pending[j] == 0) {
            PyObject *done = PyDict_GetItemWithError(r->acc, key);
            if (done != NULL) {
                Py_INCREF(done);
                failed = PyDict_DelItem(r->acc, key) < 0 || emit(r, j, done, NULL, NULL) < 0;
                Py_DECREF(done);
            } else {
                failed = PyErr_Occurred() != NULL;
            }
        }
        Py_DECREF(key);
        if (failed)
            return -1;
    }
    r->left -= 1;
    if (r->left <= 0) /* every node has run: the next run of the graph (retain_graph) is a new backward call */
        return rows_reset(r);
    return 0;
}

/* ------------------------------------------------------------------ a node's hook */
typedef struct {
    PyObject_HEAD
    Rows *rows;
    PyObject *outs;  /* tuple of (path, output_nr) */
    PyObject *edges; /* tuple of (index into the node's grad_inputs, input) */
} NodeHook;

static PyObject *NodeHook_call(NodeHook *h, PyObject *args, PyObject *kw)
{
    if (h->rows == NULL || !PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 2 || (kw != NULL && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "a node hook takes (grad_inputs, grad_outputs)");
        return NULL;
    }
    PyObject *ctx = h->rows->ctx, *rec = CTX(ctx, C_RECORDER);
    int on = truth(SLOT_GET(rec, active));
    if (on > 0) { /* a hook of an earlier step's (its graph outlived the step) does nothing */
        PyObject *now = SLOT_GET(rec, backward_epoch);
        on = now == NULL ? -1 : now == h->rows->epoch;
        Py_XDECREF(now);
    }
    if (on <= 0)
        return on < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *off;
    if (working_off_enter(CTX(ctx, C_LOCK_ACQUIRE), CTX(ctx, C_LOCK_RELEASE), CTX(ctx, C_NO_TORCH_FUNCTION), rec, &off)
        < 0)
        return NULL;
    int failed = 0;
    Py_INCREF(h); /* the hook may be removed (and freed) by what it calls */
    if (on_node(h->rows, h->outs, h->edges, PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1)) < 0)
        failed = note_error(CTX(ctx, C_NOTE_ERROR), Py_NewRef(s_where)) < 0; /* never break the backward */
    Py_DECREF(h);
    if (working_off_leave(CTX(ctx, C_LOCK_RELEASE), rec, off) < 0 || failed)
        return NULL;
    return Py_NewRef(Py_None);
}

static int NodeHook_traverse(NodeHook *h, visitproc visit, void *arg)
{
    Py_VISIT(h->rows);
    return 0;
}

static int NodeHook_clear(NodeHook *h)
{
    Py_CLEAR(h->rows);
    Py_CLEAR(h->outs);
    Py_CLEAR(h->edges);
    return 0;
}

static void NodeHook_dealloc(NodeHook *h)
{
    PyObject_GC_UnTrack(h);
    NodeHook_clear(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyTypeObject NodeHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_nb.capture._api_backward.NodeHook",
    .tp_basicsize = sizeof(NodeHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The post-hook of one node of a recorded call (BackwardRows.hook_for).",
    .tp_call = (ternaryfunc)NodeHook_call,
    .tp_traverse = (traverseproc)NodeHook_traverse,
    .tp_clear = (inquiry)NodeHook_clear,
    .tp_dealloc = (destructor)NodeHook_dealloc,
};

/* ------------------------------------------------------------------ the walk and the hooks */
typedef struct {
    PyObject_HEAD
    PyObject *ctx;
} Attacher;

/* list of [node, [pairs]] under id(node) in d, made when missing: a borrowed reference to the pairs list */
static PyObject *entry_of(PyObject *d, PyObject *node)
{
    PyObject *key = PyLong_FromVoidPtr(node);
    if (key == NULL)
        return NULL;
    PyObject *e = PyDict_GetItemWithError(d, key);
    if (e == NULL && !PyErr_Occurred()) {
        PyObject *pairs = PyList_New(0);
        e = pairs != NULL ? PyTuple_Pack(2, node, pairs) : NULL;
        Py_XDECREF(pairs);
        if (e == NULL || PyDict_SetItem(d, key, e) < 0) {
            Py_XDECREF(e);
            Py_DECREF(key);
            return NULL;
        }
        Py_DECREF(e); /* the dict holds it */
    }
    Py_DECREF(key);
    return e != NULL ? PyTuple_GET_ITEM(e, 1) : NULL;
}

/* node._sequence_nr() >= seq0: 1, 0, -1 on error */
static int made_by_call(PyObject *node, PyObject *seq0)
{
    PyObject *sn = PyObject_CallMethodNoArgs(node, s_sequence_nr);
    if (sn == NULL)
        return -1;
    int r = PyObject_RichCompareBool(sn, seq0, Py_GE);
    Py_DECREF(sn);
    return r;
}

static int append_pair(PyObject *list, PyObject *a, PyObject *b)
{
    PyObject *pair = PyTuple_Pack(2, a, b);
    int r = pair != NULL ? PyList_Append(list, pair) : -1;
    Py_XDECREF(pair);
    return r;
}

/* CallGraph.of's outputs: id(node) -> (node, [(path, output_nr)]) for the outputs whose node the call made */
static int graph_outputs(PyObject *ctx, PyObject *out, PyObject *seq0, PyObject *outputs)
{
    PyObject *items;
    if (PyTuple_Check(out) || PyList_Check(out) || PyDict_Check(out)) {
        items = PyObject_CallOneArg(CTX(ctx, C_LEAVES), out);
    } else {
        PyObject *pair = PyTuple_Pack(2, s_zero_path, out);
        items = pair != NULL ? PyTuple_Pack(1, pair) : NULL;
        Py_XDECREF(pair);
    }
    if (items == NULL)
        return -1;
    PyObject *seq = PySequence_Fast(items, "leaves() must give a sequence");
    Py_DECREF(items);
    if (seq == NULL)
        return -1;
    int failed = 0;
    for (Py_ssize_t k = 0; !failed && k < PySequence_Fast_GET_SIZE(seq); k++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, k);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "leaves() must give (path, leaf) pairs");
            failed = 1;
            break;
        }
        PyObject *t = PyTuple_GET_ITEM(pair, 1);
        int is = PyObject_IsInstance(t, CTX(ctx, C_TENSOR));
        if (is <= 0) {
            failed = is < 0;
            continue;
        }
        PyObject *fn = GETSET_GET(t, grad_fn);
        if (fn == NULL) {
            failed = 1;
            break;
        }
        int mine = fn != Py_None ? made_by_call(fn, seq0) : 0;
        if (mine > 0) {
            PyObject *nr = GETSET_GET(t, output_nr);
            PyObject *pairs = nr != NULL ? entry_of(outputs, fn) : NULL;
            failed = pairs == NULL || append_pair(pairs, PyTuple_GET_ITEM(pair, 0), nr) < 0;
            Py_XDECREF(nr);
        } else {
            failed = mine < 0;
        }
        Py_DECREF(fn);
    }
    Py_DECREF(seq);
    return failed ? -1 : 0;
}

/* edge_key(node, nr): a leaf's accumulator stands for the leaf */
static PyObject *edge_key(PyObject *ctx, PyObject *node, PyObject *nr)
{
    if ((PyObject *)Py_TYPE(node) == CTX(ctx, C_ACCUMULATE_GRAD)) {
        PyObject *var = PyObject_GetAttr(node, s_variable);
        PyObject *id = var != NULL ? PyLong_FromVoidPtr(var) : NULL;
        Py_XDECREF(var);
        PyObject *key = id != NULL ? PyTuple_Pack(2, id, k_minus_one) : NULL;
        Py_XDECREF(id);
        return key;
    }
    PyObject *id = PyLong_FromVoidPtr(node);
    PyObject *key = id != NULL ? PyTuple_Pack(2, id, nr) : NULL;
    Py_XDECREF(id);
    return key;
}

/* CallGraph.of's walk: from the outputs' nodes back to the edges into the inputs' nodes (wanted: (id, nr) ->
   input), never into a node older than the call; past max_nodes, no input gradients at all. */
static int graph_edges(PyObject *ctx, PyObject *outputs, PyObject *wanted, PyObject *seq0, PyObject *edges,
                       Py_ssize_t *counts, Py_ssize_t ninputs)
{
    Py_ssize_t max_nodes = PyLong_AsSsize_t(CTX(ctx, C_MAX_NODES));
    if (max_nodes == -1 && PyErr_Occurred())
        return -1;
    PyObject *todo = PyList_New(0), *seen = PySet_New(NULL);
    int failed = todo == NULL || seen == NULL;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (!failed && PyDict_Next(outputs, &pos, &key, &value))
        failed = PyList_Append(todo, PyTuple_GET_ITEM(value, 0)) < 0 || PySet_Add(seen, key) < 0;
    while (!failed && PyList_GET_SIZE(todo)) {
        Py_ssize_t last = PyList_GET_SIZE(todo) - 1;
        PyObject *node = Py_NewRef(PyList_GET_ITEM(todo, last));
        failed = PyList_SetSlice(todo, last, last + 1, NULL) < 0;
        PyObject *nf = failed ? NULL : PyObject_GetAttr(node, s_next_functions);
        PyObject *fast = nf != NULL ? PySequence_Fast(nf, "next_functions must be a sequence") : NULL;
        Py_XDECREF(nf);
        failed = fast == NULL;
        for (Py_ssize_t i = 0; !failed && fast != NULL && i < PySequence_Fast_GET_SIZE(fast); i++) {
            PyObject *edge = PySequence_Fast_GET_ITEM(fast, i);
            if (!PyTuple_Check(edge) || PyTuple_GET_SIZE(edge) != 2) {
                PyErr_SetString(PyExc_TypeError, "next_functions must hold (node, nr) pairs");
                failed = 1;
                break;
            }
            PyObject *nxt = PyTuple_GET_ITEM(edge, 0), *nr = PyTuple_GET_ITEM(edge, 1);
            if (nxt == Py_None)
                continue;
            PyObject *ek = edge_key(ctx, nxt, nr);
            PyObject *w = ek != NULL ? PyDict_GetItemWithError(wanted, ek) : NULL;
            Py_XDECREF(ek);
            if (w != NULL) {
                Py_ssize_t j = PyLong_AsSsize_t(w);
                PyObject *pairs = entry_of(edges, node), *ii = PyLong_FromSsize_t(i);
                failed = pairs == NULL || ii == NULL || append_pair(pairs, ii, w) < 0 || j < 0 || j >= ninputs;
                Py_XDECREF(ii);
                if (!failed)
                    counts[j] += 1;
                continue;
            }
            if (ek == NULL || PyErr_Occurred()) {
                failed = 1;
                break;
            }
            if ((PyObject *)Py_TYPE(nxt) == CTX(ctx, C_ACCUMULATE_GRAD))
                continue;
            PyObject *id = PyLong_FromVoidPtr(nxt);
            int known = id != NULL ? PySet_Contains(seen, id) : -1;
            int mine = known == 0 ? made_by_call(nxt, seq0) : 0;
            if (known < 0 || mine < 0)
                failed = 1;
            else if (mine)
                failed = PySet_Add(seen, id) < 0 || PyList_Append(todo, nxt) < 0;
            Py_XDECREF(id);
        }
        Py_XDECREF(fast);
        Py_DECREF(node);
        if (!failed && PySet_GET_SIZE(seen) > max_nodes) { /* not one call's graph: the output gradients only */
            PyDict_Clear(edges);
            memset(counts, 0, sizeof(Py_ssize_t) * (size_t)ninputs);
            break;
        }
    }
    Py_XDECREF(todo);
    Py_XDECREF(seen);
    return failed ? -1 : 0;
}

/* Attacher.attach(c, out, inputs, seq0, bname, parent): GradientHooks.attach_api_backward past its checks. */
/* The backward's name and its parent's, as GradientHooks.attach_api_backward gives them: bname (a new reference)
   from c.call, *parent (a new reference) the backward name of c.parent ("" without one); NULL on error. */
static PyObject *backward_names(PyObject *ctx, PyObject *c, PyObject **parent)
{
    *parent = NULL;
    PyObject *call = SLOT_GET(c, call), *bname = NULL;
    if (call == NULL)
        return NULL;
    int tail = PyUnicode_Check(call) ? (int)PyUnicode_Tailmatch(call, s_dot_forward, 0, PY_SSIZE_T_MAX, 1) : 0;
    if (tail < 0)
        goto done;
    if (tail) { /* call[:-7] + "backward" */
        PyObject *head = PyUnicode_Substring(call, 0, PyUnicode_GET_LENGTH(call) - 7);
        bname = head != NULL ? PyUnicode_Concat(head, s_backward) : NULL;
        Py_XDECREF(head);
    } else {
        bname = PyObject_CallOneArg(CTX(ctx, C_BACKWARD_NAME), call);
    }
    PyObject *p = bname != NULL ? SLOT_GET(c, parent) : NULL;
    int has = p != NULL ? PyObject_IsTrue(p) : -1;
    if (has > 0)
        *parent = cached(CTX(ctx, C_BACKWARD_NAMES), CTX(ctx, C_BACKWARD_OF), p);
    else if (has == 0)
        *parent = Py_NewRef(s_empty);
    Py_XDECREF(p);
    if (*parent == NULL)
        Py_CLEAR(bname);
done:
    Py_DECREF(call);
    return bname;
}

static PyObject *Attacher_attach(Attacher *a, PyObject *const *argv, Py_ssize_t nargs)
{
    if (nargs != 6 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "attach(c, out, inputs, seq0[, bname, parent])");
        return NULL;
    }
    PyObject *ctx = a->ctx, *c = argv[0], *out = argv[1], *inputs = argv[2], *seq0 = argv[3];
    if (inputs != Py_None && !PyList_Check(inputs)) {
        PyErr_SetString(PyExc_TypeError, "attach: inputs must be a list or None");
        return NULL;
    }
    Py_ssize_t ninputs = inputs == Py_None ? 0 : PyList_GET_SIZE(inputs);
    PyObject *outputs = PyDict_New(), *edges = PyDict_New(), *wanted = PyDict_New(), *paths = PyTuple_New(ninputs);
    PyObject *counts_t = NULL, *result = NULL, *nodes = NULL;
    Rows *rows = NULL;
    Py_ssize_t *counts = PyMem_Calloc((size_t)(ninputs ? ninputs : 1), sizeof(Py_ssize_t));
    if (outputs == NULL || edges == NULL || wanted == NULL || paths == NULL || counts == NULL)
        goto done;
    if (graph_outputs(ctx, out, seq0, outputs) < 0)
        goto done;
    if (PyDict_GET_SIZE(outputs) == 0) { /* no node of the call's: no backward */
        result = Py_NewRef(Py_None);
        goto done;
    }
    for (Py_ssize_t j = 0; j < ninputs; j++) {
        PyObject *item = PyList_GET_ITEM(inputs, j), *key;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !PyTuple_Check(key = PyTuple_GET_ITEM(item, 1))
            || PyTuple_GET_SIZE(key) < 2) {
            PyErr_SetString(PyExc_TypeError, "attach: inputs must hold (path, (id, nr, ...)) pairs");
            goto done;
        }
        PyTuple_SET_ITEM(paths, j, Py_NewRef(PyTuple_GET_ITEM(item, 0)));
        PyObject *k2 = PyTuple_GetSlice(key, 0, 2), *jj = PyLong_FromSsize_t(j);
        int had = k2 != NULL && jj != NULL ? PyDict_Contains(wanted, k2) : -1;
        int failed = had < 0 || (!had && PyDict_SetItem(wanted, k2, jj) < 0);
        Py_XDECREF(k2);
        Py_XDECREF(jj);
        if (failed)
            goto done;
    }
    if (PyDict_GET_SIZE(wanted) && graph_edges(ctx, outputs, wanted, seq0, edges, counts, ninputs) < 0)
        goto done;
    /* every node that needs a hook: the outputs' nodes, then the nodes owning an input edge */
    nodes = PyList_New(0);
    counts_t = PyTuple_New(ninputs);
    if (nodes == NULL || counts_t == NULL)
        goto done;
    for (Py_ssize_t j = 0; j < ninputs; j++) {
        PyObject *n = PyLong_FromSsize_t(counts[j]);
        if (n == NULL)
            goto done;
        PyTuple_SET_ITEM(counts_t, j, n);
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(outputs, &pos, &key, &value))
        if (PyList_Append(nodes, key) < 0)
            goto done;
    pos = 0;
    while (PyDict_Next(edges, &pos, &key, &value)) {
        int known = PyDict_Contains(outputs, key);
        if (known < 0 || (!known && PyList_Append(nodes, key) < 0))
            goto done;
    }
    rows = PyObject_GC_New(Rows, &RowsType);
    if (rows == NULL)
        goto done;
    rows->ctx = Py_NewRef(ctx);
    if (nargs == 6) {
        rows->bname = Py_NewRef(argv[4]);
        rows->parent = Py_NewRef(argv[5]);
    } else { /* from the C handler: the names attach_api_backward would have given */
        rows->bname = backward_names(ctx, c, &rows->parent);
    }
    rows->family = SLOT_GET(c, family);
    rows->op = SLOT_GET(c, op);
    rows->counter = SLOT_GET(c, counter);
    rows->module_path = SLOT_GET(c, module_path);
    rows->stack_id = SLOT_GET(c, stack_id);
    rows->paths = Py_NewRef(paths);
    rows->counts = Py_NewRef(counts_t);
    rows->call = NULL;
    rows->acc = PyDict_New();
    rows->epoch = SLOT_GET(CTX(ctx, C_RECORDER), backward_epoch);
    rows->pending = PyMem_Calloc((size_t)(ninputs ? ninputs : 1), sizeof(Py_ssize_t));
    rows->ninputs = ninputs;
    rows->nodes = PyList_GET_SIZE(nodes);
    rows->share = 0;
    PyObject_GC_Track(rows);
    if (rows->bname == NULL || rows->parent == NULL || rows->family == NULL || rows->op == NULL
        || rows->counter == NULL || rows->module_path == NULL || rows->stack_id == NULL || rows->acc == NULL
        || rows->epoch == NULL || rows->pending == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    PyObject *fo = PyTuple_Pack(2, rows->family, rows->op);
    rows->share = fo != NULL ? PySet_Contains(CTX(ctx, C_SAME_ELEMENTS), fo) : -1;
    Py_XDECREF(fo);
    if (rows->share < 0 || rows_reset(rows) < 0)
        goto done;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(nodes); k++) {
        PyObject *id = PyList_GET_ITEM(nodes, k);
        PyObject *o = PyDict_GetItemWithError(outputs, id), *e = o == NULL && PyErr_Occurred() ? NULL
                                                                : PyDict_GetItemWithError(edges, id);
        if (PyErr_Occurred())
            goto done;
        PyObject *node = PyTuple_GET_ITEM(o != NULL ? o : e, 0);
        NodeHook *h = PyObject_GC_New(NodeHook, &NodeHookType);
        if (h == NULL)
            goto done;
        h->rows = (Rows *)Py_NewRef(rows);
        h->outs = o != NULL ? PyList_AsTuple(PyTuple_GET_ITEM(o, 1)) : PyTuple_New(0);
        h->edges = e != NULL ? PyList_AsTuple(PyTuple_GET_ITEM(e, 1)) : PyTuple_New(0);
        PyObject_GC_Track(h);
        PyObject *handle = h->outs != NULL && h->edges != NULL
                               ? PyObject_CallMethodOneArg(node, s_register_hook, (PyObject *)h) : NULL;
        Py_DECREF(h);
        if (handle == NULL)
            goto done;
        Py_DECREF(handle); /* not removed at the step's end: the epoch retires the hook (NodeHook_call) */
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(outputs);
    Py_XDECREF(edges);
    Py_XDECREF(wanted);
    Py_XDECREF(paths);
    Py_XDECREF(counts_t);
    Py_XDECREF(nodes);
    Py_XDECREF(rows);
    PyMem_Free(counts);
    return result;
}

static PyObject *Attacher_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *ctx = context_arg(args, kw, C_SIZE, "Attacher");
    if (ctx == NULL)
        return NULL;
    if (!PyAnySet_Check(CTX(ctx, C_SAME_ELEMENTS)) || !PyLong_Check(CTX(ctx, C_MAX_NODES))) {
        PyErr_SetString(PyExc_TypeError, "Attacher: same_elements must be a set, max_nodes an int");
        return NULL;
    }
    Attacher *a = (Attacher *)type->tp_alloc(type, 0);
    if (a != NULL)
        a->ctx = Py_NewRef(ctx);
    return (PyObject *)a;
}

static int Attacher_traverse(Attacher *a, visitproc visit, void *arg)
{
    Py_VISIT(a->ctx);
    return 0;
}

static int Attacher_clear(Attacher *a)
{
    Py_CLEAR(a->ctx);
    return 0;
}

static void Attacher_dealloc(Attacher *a)
{
    PyObject_GC_UnTrack(a);
    Attacher_clear(a);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

static PyObject *Attacher_attach_checked(Attacher *a, PyObject *const *argv, Py_ssize_t nargs)
{
    if (a->ctx == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Attacher: cleared");
        return NULL;
    }
    return Attacher_attach(a, argv, nargs);
}

static PyMethodDef Attacher_methods[] = {
    {"attach", (PyCFunction)(void (*)(void))Attacher_attach_checked, METH_FASTCALL,
     "attach(c, out, inputs, seq0[, bname, parent]): hook the nodes call c made, as attach_api_backward does "
     "(without the names, from the C handler: they are found as attach_api_backward finds them)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject AttacherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_nb.capture._api_backward.Attacher",
    .tp_basicsize = sizeof(Attacher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Attacher(ctx): the API backward of one recorder (ctx: CONTEXT_FIELDS, in order).",
    .tp_new = Attacher_new,
    .tp_traverse = (traverseproc)Attacher_traverse,
    .tp_clear = (inquiry)Attacher_clear,
    .tp_dealloc = (destructor)Attacher_dealloc,
    .tp_methods = Attacher_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_api_backward",
                                    "One API call's backward rows and node hooks, in C.", -1, NULL, NULL, NULL, NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__api_backward(void)
{
    if (api_calls_init() < 0 || API_INTERN(s_parent, "parent") || API_INTERN(s_dot_forward, ".forward")
        || API_INTERN(s_active, "active") || API_INTERN(s_backward_epoch, "backward_epoch")
        || API_INTERN(s_grad_fn, "grad_fn")
        || API_INTERN(s_output_nr, "output_nr") || API_INTERN(s_sequence_nr, "_sequence_nr")
        || API_INTERN(s_next_functions, "next_functions") || API_INTERN(s_variable, "variable")
        || API_INTERN(s_register_hook, "register_hook") || API_INTERN(s_family, "family") || API_INTERN(s_op, "op")
        || API_INTERN(s_counter, "counter") || API_INTERN(s_module_path, "module_path")
        || API_INTERN(s_stack_id, "stack_id") || API_INTERN(s_construct, "construct")
        || API_INTERN(s_backward, "backward") || API_INTERN(s_input, "input") || API_INTERN(s_output, "output")
        || API_INTERN(s_detach, "detach") || API_INTERN(s_clone, "clone")
        || API_INTERN(s_zero_path, "0") || API_INTERN(s_where, "an API backward")
        || API_INTERN(s_call, "call"))
        return NULL;
    if (PyType_Ready(&RowsType) < 0 || PyType_Ready(&NodeHookType) < 0 || PyType_Ready(&AttacherType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (add_layout(m, API_BACKWARD_ABI, CONTEXT_NAMES, C_SIZE, "Attacher", &AttacherType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
