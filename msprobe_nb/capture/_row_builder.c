/* The recorder's rows for the common leaves of a call, built in C: plain tensors, None and plain values.
 *
 * Why: every recorded call appends one row per argument and result (Recorder.add_rows), and in Python the
 * per-leaf work (a dozen attribute reads, a name, a 16-field tuple) was most of what recording costs a
 * call beyond the op itself. build_rows walks a flat list, tuple or dict as leaves.leaves() does (nested
 * values through leaves.walk, anything else through leaves() itself), does the same per-leaf work for the
 * leaves it knows, and hands every other leaf (a tensor subclass, a path that is not a string) to the
 * recorder's own Python code, row_of, so the two paths give the same rows (tests/test_row_builder.py holds
 * them equal). A tensor first met, changed in
 * place, or coming out of the call is given its identity here as Recorder._first_sight does, and its
 * statistics as Summarizer.summarize does for a finite contiguous float32 CPU tensor (the shared kernel,
 * _stats_pass.h), with the tensor task's host copy of a small one; any other tensor is summarised by
 * Summarizer.summarize itself.
 *
 * setup.py builds it as an optional extension; without it Recorder.add_rows runs its Python loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>

#include "_stats_pass.h"
#include "_slot_attrs.h"
#include "_dotted_names.h"
/* the attributes read at their slots (_slot_attrs.h) */
SLOT_CACHE(next_id);
SLOT_CACHE(tensors);
SLOT_CACHE(values);
SLOT_CACHE(flat);

static PyObject *s_version, *s_dtype, *s_shape, *s_numel, *s_is_cpu, *s_requires_grad, *s_empty;
static PyObject *s_layout, *s_is_contiguous, *s_stride, *s_is_neg, *s_data_ptr, *s_values, *s_flat, *s_next_id, *s_tensors;
static PyObject *k_tensor, *k_none, *k_value, *k_zero, *k_minus_one, *k_one;
/* the tensor attributes read through their getters (_slot_attrs.h) */
GETSET_CACHE(layout);
GETSET_CACHE(version);
GETSET_CACHE(dtype);
GETSET_CACHE(is_cpu);
GETSET_CACHE(shape);
GETSET_CACHE(requires_grad);
/* and the methods called before the kernel reads a tensor */
METHOD_CACHE(is_contiguous);
METHOD_CACHE(is_neg);
METHOD_CACHE(data_ptr);

/* ctx, made once per recorder (Recorder._row_ctx): the Python parts build_rows calls, the objects it
   compares with, and the constants of its rows. C_SUMMARIZE is the summarizer's summarize; C_KERNEL is true
   where the summarizer itself would use the C kernel (a statistics-only summarizer, _fused_stats built);
   C_SCALAR_TEXT is leaves.SCALAR_TEXT, describe_value's cache of plain scalars; C_HOST_COPY is
   Summarizer.host_copies_in_c(): (numpy.empty, numpy's float32, the largest copy in bytes) where the tensor
   task's summarizer would copy a small float32 tensor into a numpy array, else None. C_FLOAT16 and C_BFLOAT16
   are those torch dtypes, C_HALF_MAX is stats.HALF_WIDEN_MAX_NUMEL: the most elements of a half-precision
   tensor widened for the kernel; C_INT_DTYPES the six integer and bool dtypes in the integer pass's code
   order (stats.INT_DTYPES). */
/* The context's fields, in order, written once: the enum below and the CONTEXT_FIELDS tuple the module exports
   (the Python side builds ctx by these names and checks them at import: capture/c_contract.py). */
#define CONTEXT(X) X(C_RECORDER, "recorder") X(C_SUMMARIZER, "summarizer") X(C_SUMMARIZE, "summarize") \
    X(C_KERNEL, "kernel") X(C_DTYPE_CODES, "dtype_codes") X(C_DTYPE_CODE, "dtype_code") \
    X(C_DEVICE_CODE, "device_code") X(C_DESCRIBE, "describe") X(C_ROW_OF, "row_of") X(C_NAN, "nan") \
    X(C_DEVICE_CPU, "device_cpu") X(C_TENSOR_TYPES, "tensor_types") X(C_TENSOR, "tensor") \
    X(C_FLOAT32, "float32") X(C_STRIDED, "strided") X(C_LEAVES, "leaves") X(C_WALK, "walk") X(C_POS, "positions") \
    X(C_SIZE_TYPE, "size_type") X(C_SCALAR_TEXT, "scalar_text") X(C_HOST_COPY, "host_copy") \
    X(C_FLOAT16, "float16") X(C_BFLOAT16, "bfloat16") X(C_HALF_MAX, "half_max") X(C_INT_DTYPES, "int_dtypes")
#define AS_ENUM(id, name) id,
#define AS_NAME(id, name) name,
enum { CONTEXT(AS_ENUM) C_SIZE };
static const char *const CONTEXT_NAMES[] = {CONTEXT(AS_NAME)};

/* A row's arity, a seen entry's (Recorder._seen: [weakref, version, summary index, tensor_id, producer]), and the
   kind codes of a row's sixth field (the recorder's KIND_CODES) */
#define ROW_ARITY 16
#define SEEN_ARITY 5
enum { KIND_TENSOR, KIND_NONE, KIND_VALUE };

static PyObject *weak_target(PyObject *ref)
{
    /* a borrowed reference to what ref points to (Py_None when dead), or NULL when ref is not a weakref */
    if (!PyWeakref_Check(ref))
        return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *obj;
    if (PyWeakref_GetRef(ref, &obj) < 0) {
        PyErr_Clear();
        return NULL;
    }
    if (obj == NULL)
        return Py_None;
    Py_DECREF(obj); /* the caller holds the tensor itself, so a borrowed pointer stays valid */
    return obj;
#else
    return PyWeakref_GetObject(ref);
#endif
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

/* What tensor_row reads of a plain tensor once and its parts share: dtype and shape (a tuple; both
   borrowed), is_cpu, and numel (the product of the shape). */
typedef struct {
    PyObject *dtype, *shape;
    int is_cpu;
    Py_ssize_t n;
} Facts;

/* What the kernel reads of a tensor, by its dtype: float32, float16 or bfloat16 widened to float32, or an
   integer or bool kind (the integer pass's code, 0-5); NONE: the summarizer's own way. */
enum { READ_NONE = -1, READ_F32 = 6, READ_F16 = 7, READ_BF16 = 8 };

static int read_kind(const Facts *f, PyObject *ctx, int stats_only)
{
    if (f->dtype == PyTuple_GET_ITEM(ctx, C_FLOAT32))
        return READ_F32;
    if (!stats_only)
        return READ_NONE;
    if (f->dtype == PyTuple_GET_ITEM(ctx, C_BFLOAT16))
        return READ_BF16;
    if (f->dtype == PyTuple_GET_ITEM(ctx, C_FLOAT16))
        return READ_F16;
    PyObject *ints = PyTuple_GET_ITEM(ctx, C_INT_DTYPES);  /* build_rows checked it: a tuple of six */
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(ints); j++)
        if (f->dtype == PyTuple_GET_ITEM(ints, j))
            return (int)j;
    return READ_NONE;
}

/* The statistics row (max, min, mean, norm, NaN, +inf, -inf) of a tensor the kernel reads, as the summarizer
   would give it; 1 when done (address: its data_ptr()), 0 when the summarizer must (NaN or inf, a layout or
   size the kernel does not take), -1 on error. */
static int kernel_row(PyObject *leaf, const Facts *f, PyObject *ctx, int kind, int copying, Py_ssize_t *address,
                      double row[7])
{
    Py_ssize_t n = f->n;
    if (kind == READ_F16 || kind == READ_BF16) {  /* only up to the size _half_stats widens */
        Py_ssize_t most = PyLong_AsSsize_t(PyTuple_GET_ITEM(ctx, C_HALF_MAX));
        if (most == -1 && PyErr_Occurred())
            return -1;
        if (n > most)
            return 0;
    }
    PyObject *v = GETSET_GET(leaf, layout);
    if (v == NULL)
        return -1;
    int strided = v == PyTuple_GET_ITEM(ctx, C_STRIDED);
    Py_DECREF(v);
    if (!strided)
        return 0;
    int contiguous = truth(METHOD_CALL0(leaf, is_contiguous));
    if (contiguous < 0)
        return -1;
    if (!contiguous && (kind != READ_F32 || copying))  /* only float32 views are read along their strides */
        return 0;
    int neg = truth(METHOD_CALL0(leaf, is_neg));
    if (neg != 0)
        return neg < 0 ? -1 : 0;
    v = METHOD_CALL0(leaf, data_ptr);
    if (v == NULL)
        return -1;
    *address = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    if (*address == -1 && PyErr_Occurred())
        return -1;
    if (*address == 0)
        return 0;
    const void *x = (const void *)*address;
    double out[4];
    int any_nan = 0, free_threads = n >= (1 << 18);
    if (kind >= 0 && kind <= 5) {  /* integers and bool: exact max and min, float64 sums, as _int_stats */
        if (free_threads) {
            Py_BEGIN_ALLOW_THREADS
            int_pass(x, n, kind, out);
            Py_END_ALLOW_THREADS
        } else {
            int_pass(x, n, kind, out);
        }
        if (kind == 5) {
            row[0] = out[0] > 0;
            row[1] = out[0] == (double)n;
            row[2] = out[0] / (double)n;
            row[3] = sqrt(out[0]);
        } else {
            row[0] = out[0];
            row[1] = out[1];
            row[2] = out[2] / (double)n;
            row[3] = sqrt(out[3]);
        }
        row[4] = row[5] = row[6] = 0.0;
        return 1;
    }
    if (kind == READ_F32 && !contiguous) {
        PyObject *strides = PyObject_CallMethodNoArgs(leaf, s_stride);
        if (strides == NULL)
            return -1;
        Py_ssize_t m = 0;
        int got = strided_pass_seq((const float *)x, f->shape, strides, &m, out);
        Py_DECREF(strides);
        if (got == -2) {  /* sizes that are not plain ints: the summarizer's own way */
            if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
        }
        if (got != 0 || m != n)
            return 0;
    } else {
        float *wide = NULL;  /* float16 / bfloat16: one float32 copy, as _half_stats makes it */
        if (kind != READ_F32 && (wide = PyMem_Malloc((size_t)n * sizeof(float))) == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (free_threads) {
            Py_BEGIN_ALLOW_THREADS
            if (wide != NULL)
                widen_half((const uint16_t *)x, n, kind == READ_BF16, wide);
            any_nan = stats_pass(wide != NULL ? wide : (const float *)x, n, out);
            Py_END_ALLOW_THREADS
        } else {
            if (wide != NULL)
                widen_half((const uint16_t *)x, n, kind == READ_BF16, wide);
            any_nan = stats_pass(wide != NULL ? wide : (const float *)x, n, out);
        }
        PyMem_Free(wide);
    }
    if (any_nan || !isfinite(out[0]) || !isfinite(out[1]))
        return 0;
    /* the kernel's (max, min, sum, norm) as _fused_stats.result gives them, then stats.py's mean = sum / n */
    double norm = f32_norm(out[3], n, out[0]);
    row[0] = out[0];
    row[1] = out[1];
    row[2] = (double)(float)out[2] / (double)n;
    row[3] = (double)(float)norm;
    row[4] = row[5] = row[6] = 0.0;
    return 1;
}

/* Write the seven statistics of the summary at index idx into flat (the summarizer's bytearray of 7 doubles per
   summary, indexed as its values), growing it to idx + 1 rows; rows between that no kernel wrote are NaN (their
   entries in values are the summarizer's own, which materialize reads instead). 0, or -1 on error. */
static int write_flat(PyObject *flat, Py_ssize_t idx, const double s[7])
{
    const Py_ssize_t row = STATS_ROW_BYTES;
    if (!PyByteArray_CheckExact(flat)) {
        PyErr_SetString(PyExc_TypeError, "the summarizer's _flat must be a bytearray");
        return -1;
    }
    Py_ssize_t have = PyByteArray_GET_SIZE(flat) / row;
    if (PyByteArray_GET_SIZE(flat) != have * row) {
        PyErr_SetString(PyExc_ValueError, "the summarizer's _flat is not whole rows of 7 doubles");
        return -1;
    }
    if (have > idx) {
        PyErr_SetString(PyExc_ValueError, "the summarizer's _flat runs ahead of its values");
        return -1;
    }
    if (PyByteArray_Resize(flat, (idx + 1) * row) < 0)
        return -1;
    double *d = (double *)PyByteArray_AS_STRING(flat);
    for (Py_ssize_t i = 7 * have; i < 7 * idx; i++)
        d[i] = NAN;
    memcpy(d + 7 * idx, s, (size_t)row);
    return 0;
}

/* Summarizer.summarize(leaf) for a plain tensor: the index of its statistics in the summarizer's values. The
   kernel's case is done here, exactly as the summarizer's own first branch and _fused_stats do it (a
   statistics-only summarizer; a not negated float32 CPU strided tensor with elements, all finite, read along
   its strides when it is not contiguous; a contiguous float16 or bfloat16 one widened as _half_stats does; a
   contiguous integer or bool one by the integer pass, as _int_stats does),
   and for the tensor task also the host copy _host_copy makes of such a tensor of at most C_HOST_COPY's bytes
   (a C-ordered numpy float32 array of its shape, appended to the summarizer's tensors); every other tensor
   goes to summarize itself. */
static PyObject *summarize(PyObject *leaf, const Facts *f, PyObject *ctx)
{
    PyObject *summ = PyTuple_GET_ITEM(ctx, C_SUMMARIZER), *how = PyTuple_GET_ITEM(ctx, C_HOST_COPY);
    Py_ssize_t n = f->n, address = 0;
    int copying = how != Py_None;  /* build_rows checked it: None or a triple */
    int stats_only = PyTuple_GET_ITEM(ctx, C_KERNEL) == Py_True;
    int kind = (stats_only || copying) && f->is_cpu && n > 0 ? read_kind(f, ctx, stats_only) : READ_NONE;
    if (kind == READ_F32 && copying) {  /* only copies the summarizer makes as numpy arrays: larger ones are torch clones */
        Py_ssize_t most = PyLong_AsSsize_t(PyTuple_GET_ITEM(how, 2));
        if (most == -1 && PyErr_Occurred())
            return NULL;
        if (n > most / (Py_ssize_t)sizeof(float))
            kind = READ_NONE;
    }
    double stats[7];
    int fast = kind == READ_NONE ? 0 : kernel_row(leaf, f, ctx, kind, copying, &address, stats);
    if (fast < 0)
        return NULL;
    if (!fast)
        return PyObject_CallOneArg(PyTuple_GET_ITEM(ctx, C_SUMMARIZE), leaf);
    PyObject *copy = NULL;  /* the tensor task's host copy: numpy.empty(shape, float32), filled from the tensor */
    if (copying) {
        copy = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(how, 0), f->shape, PyTuple_GET_ITEM(how, 1), NULL);
        if (copy == NULL)
            return NULL;
        Py_buffer view;
        if (PyObject_GetBuffer(copy, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            Py_DECREF(copy);
            return NULL;
        }
        int fits = view.len == n * (Py_ssize_t)sizeof(float);
        if (fits)
            memcpy(view.buf, (const void *)address, (size_t)view.len);
        PyBuffer_Release(&view);
        if (!fits) {
            PyErr_SetString(PyExc_ValueError, "a host copy's buffer does not match its tensor's size");
            Py_DECREF(copy);
            return NULL;
        }
    }
    /* the statistics go to the summarizer's flat buffer, its values get the mark (Ellipsis) at their index */
    PyObject *values = SLOT_GET(summ, values);
    PyObject *flat = values == NULL ? NULL : SLOT_GET(summ, flat);
    PyObject *tensors = flat == NULL || !copying ? NULL : SLOT_GET(summ, tensors);
    Py_ssize_t idx = -1;
    if (flat != NULL && (!copying || tensors != NULL)) {
        if (!PyList_CheckExact(values) || (copying && !PyList_CheckExact(tensors)))
            PyErr_SetString(PyExc_TypeError, "the summarizer's values and tensors must be lists");
        else if (copying && PyList_GET_SIZE(tensors) != PyList_GET_SIZE(values))
            PyErr_SetString(PyExc_ValueError, "the summarizer's values and tensors are not aligned");
        else if (write_flat(flat, PyList_GET_SIZE(values), stats) == 0) {
            Py_ssize_t at = PyList_GET_SIZE(values);
            if (PyList_Append(values, Py_Ellipsis) == 0) {
                idx = at;  /* as summarize: the statistics, then the copy */
                if (copying && PyList_Append(tensors, copy) < 0)
                    idx = -1;
            } else {  /* no entry after all: its row goes, so the buffer stays indexed as values */
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                (void)PyByteArray_Resize(flat, at * STATS_ROW_BYTES);
                PyErr_Restore(type, value, tb);
            }
        }
    }
    Py_XDECREF(values);
    Py_XDECREF(flat);
    Py_XDECREF(tensors);
    Py_XDECREF(copy);
    return idx < 0 ? NULL : PyLong_FromSsize_t(idx);
}

/* the recorder's next tensor_id, counted on */
static PyObject *take_tensor_id(PyObject *rec)
{
    PyObject *tid = SLOT_GET(rec, next_id);
    if (tid == NULL)
        return NULL;
    PyObject *next = PyNumber_Add(tid, k_one);
    if (next == NULL || SLOT_SET(rec, next_id, next) < 0) {
        Py_XDECREF(next);
        Py_DECREF(tid);
        return NULL;
    }
    Py_DECREF(next);
    return tid;
}

/* The summary index, tensor_id and producer of a plain tensor into got[0..2] (new references), and its entry in
   seen, as Recorder._first_sight and the seen check before it give them; 0, or -1 on error (got untouched). An
   entry is [weakref, version, summary index, tensor_id, producer]. */
static int tensor_identity(PyObject *leaf, const Facts *f, PyObject *seen, PyObject *call, PyObject *set_producer,
                           PyObject *ctx, PyObject *got[3])
{
    PyObject *rec = PyTuple_GET_ITEM(ctx, C_RECORDER);
    PyObject *key = PyLong_FromVoidPtr(leaf);
    if (key == NULL)
        return -1;
    int status = -1;
    PyObject *version = NULL, *idx = NULL, *tid = NULL;
    PyObject *e = PyDict_GetItemWithError(seen, key);
    if (e == NULL && PyErr_Occurred())
        goto done;
    Py_XINCREF(e);  /* held: the getters and summarize below may run Python code */
    if (e != NULL && !(PyList_CheckExact(e) && PyList_GET_SIZE(e) == 5)) {
        PyErr_SetString(PyExc_TypeError, "an entry of the recorder's seen tensors is not a list of five");
        goto done;
    }
    int alive = e != NULL && weak_target(PyList_GET_ITEM(e, 0)) == leaf;
    version = GETSET_GET(leaf, version);
    if (version == NULL)
        goto done;
    if (!alive) {  /* a new object (or a dead one's id reused): a new tensor_id and a summary */
        tid = take_tensor_id(rec);
        if (tid == NULL)
            goto done;
        idx = summarize(leaf, f, ctx);
        if (idx == NULL)
            goto done;
        PyObject *ref = PyWeakref_NewRef(leaf, NULL);
        if (ref == NULL) {  /* not weak-referenceable: never cached */
            if (!PyErr_ExceptionMatches(PyExc_TypeError))
                goto done;
            PyErr_Clear();
        } else {
            PyObject *entry = PyList_New(SEEN_ARITY);
            if (entry == NULL) {
                Py_DECREF(ref);
                goto done;
            }
            PyObject *producer = set_producer == Py_True ? call : s_empty;
            Py_INCREF(version);
            Py_INCREF(idx);
            Py_INCREF(tid);
            Py_INCREF(producer);
            PyList_SET_ITEM(entry, 0, ref);
            PyList_SET_ITEM(entry, 1, version);
            PyList_SET_ITEM(entry, 2, idx);
            PyList_SET_ITEM(entry, 3, tid);
            PyList_SET_ITEM(entry, 4, producer);
            int failed = PyDict_SetItem(seen, key, entry);
            Py_DECREF(entry);
            if (failed)
                goto done;
        }
        got[0] = Py_NewRef(idx);
        got[1] = Py_NewRef(tid);
        got[2] = Py_NewRef(s_empty);
        status = 0;
        goto done;
    }
    int same = PyObject_RichCompareBool(PyList_GET_ITEM(e, 1), version, Py_EQ);
    if (same < 0)
        goto done;
    if (!same) {  /* changed in place since it was summarised */
        idx = summarize(leaf, f, ctx);
        if (idx == NULL)
            goto done;
        Py_INCREF(version);  /* PyList_SetItem steals a reference: done releases ours */
        PyList_SetItem(e, 1, version);
        Py_INCREF(idx);
        PyList_SetItem(e, 2, idx);
    }
    if (set_producer == Py_True) {  /* an object seen before comes out of this call: a new identity */
        tid = take_tensor_id(rec);
        if (tid == NULL)
            goto done;
        Py_INCREF(tid);
        PyList_SetItem(e, 3, tid);
        Py_INCREF(call);
        PyList_SetItem(e, 4, call);
        got[0] = Py_NewRef(PyList_GET_ITEM(e, 2));
        got[1] = Py_NewRef(tid);
        got[2] = Py_NewRef(s_empty);
    } else {
        got[0] = Py_NewRef(PyList_GET_ITEM(e, 2));
        got[1] = Py_NewRef(PyList_GET_ITEM(e, 3));
        got[2] = Py_NewRef(PyList_GET_ITEM(e, 4));
    }
    status = 0;
done:
    Py_XDECREF(e);
    Py_DECREF(key);
    Py_XDECREF(version);
    Py_XDECREF(idx);
    Py_XDECREF(tid);
    return status;
}

/* numel of a shape (a tuple of ints), or -1 where some size is not a plain int or the product overflows */
static Py_ssize_t shape_numel(PyObject *shape)
{
    Py_ssize_t n = 1;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(shape); j++) {
        PyObject *d = PyTuple_GET_ITEM(shape, j);
        if (!PyLong_CheckExact(d))
            return -1;
        Py_ssize_t v = PyLong_AsSsize_t(d);
        if (v < 0 || (v != 0 && n > PY_SSIZE_T_MAX / v)) {
            PyErr_Clear();
            return -1;
        }
        n *= v;
    }
    return n;
}

/* Shapes of plain ints made plain tuples once and shared by every row that has them, in this step and later ones:
   a row holds no tuple of its own, and the writer finds the last step's shape column equal to this one's object
   by object. Cleared when it reaches SHAPES_KEPT (a model whose shapes change every step). */
#define SHAPES_KEPT 4096
static PyObject *shapes_seen;

/* size (a torch.Size) as a plain tuple (a new reference): the one shapes_seen holds for it where it has one */
static PyObject *shared_shape(PyObject *size)
{
    if (PyTuple_Check(size)) {
        PyObject *hit = PyDict_GetItemWithError(shapes_seen, size);
        if (hit != NULL)
            return Py_NewRef(hit);
        if (PyErr_Occurred()) {  /* sizes that do not hash (symbolic): a tuple of their own */
            if (!PyErr_ExceptionMatches(PyExc_TypeError))
                return NULL;
            PyErr_Clear();
        }
    }
    /* a torch.Size is a tuple: its items copied at once, not through its iterator */
    PyObject *shape = PyTuple_Check(size) ? PyTuple_GetSlice(size, 0, PyTuple_GET_SIZE(size)) : PySequence_Tuple(size);
    if (shape == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(shape); j++)
        if (!PyLong_CheckExact(PyTuple_GET_ITEM(shape, j)))
            return shape;  /* kept out of the table: only plain ints compare and hash as the writer's keys do */
    if (PyDict_GET_SIZE(shapes_seen) >= SHAPES_KEPT)
        PyDict_Clear(shapes_seen);
    if (PyDict_SetItem(shapes_seen, shape, shape) < 0) {
        Py_DECREF(shape);
        return NULL;
    }
    return shape;
}

static PyObject *tensor_row(PyObject *k, PyObject *name, PyObject *io, PyObject *path, PyObject *is_kwarg,
                            PyObject *leaf, PyObject *seen, PyObject *call, PyObject *set_producer, PyObject *ctx)
{
    PyObject *row = NULL, *ident[3] = {NULL, NULL, NULL}, *dtype = NULL, *code = NULL, *size = NULL, *shape = NULL;
    PyObject *numel = NULL, *device = NULL, *is_cpu = NULL, *grad = NULL;
    dtype = GETSET_GET(leaf, dtype);
    if (dtype == NULL)
        goto done;
    is_cpu = GETSET_GET(leaf, is_cpu);
    if (is_cpu == NULL)
        goto done;
    size = GETSET_GET(leaf, shape);
    if (size == NULL)
        goto done;
    shape = shared_shape(size);
    if (shape == NULL)
        goto done;
    Py_ssize_t n = shape_numel(shape);
    if (n < 0) {  /* not a product of plain ints: the tensor's own count */
        numel = PyObject_CallMethodNoArgs(leaf, s_numel);
        if (numel == NULL)
            goto done;
        n = PyLong_AsSsize_t(numel);
        if (n == -1 && PyErr_Occurred())
            goto done;
    } else {
        numel = PyLong_FromSsize_t(n);
        if (numel == NULL)
            goto done;
    }
    Facts facts = {dtype, shape, is_cpu == Py_True, n};
    if (tensor_identity(leaf, &facts, seen, call, set_producer, ctx, ident) < 0)
        goto done;
    code = PyDict_GetItemWithError(PyTuple_GET_ITEM(ctx, C_DTYPE_CODES), dtype);
    if (code != NULL && PyObject_IsTrue(code) == 1) {
        Py_INCREF(code);
    } else {  /* a dtype met for the first time: the vocabulary gives it a code */
        if (PyErr_Occurred())
            goto done;
        code = PyObject_CallOneArg(PyTuple_GET_ITEM(ctx, C_DTYPE_CODE), dtype);
        if (code == NULL)
            goto done;
    }
    if (is_cpu == Py_True) {
        device = PyTuple_GET_ITEM(ctx, C_DEVICE_CPU);
        Py_INCREF(device);
    } else {
        device = PyObject_CallOneArg(PyTuple_GET_ITEM(ctx, C_DEVICE_CODE), leaf);
        if (device == NULL)
            goto done;
    }
    grad = GETSET_GET(leaf, requires_grad);
    if (grad == NULL)
        goto done;
    row = PyTuple_Pack(ROW_ARITY, k, name, io, path, is_kwarg, k_tensor, code, shape, numel, device, grad,
                       ident[0], s_empty, s_empty, ident[1], ident[2]);
done:
    for (int j = 0; j < 3; j++)
        Py_XDECREF(ident[j]);
    Py_XDECREF(dtype);
    Py_XDECREF(code);
    Py_XDECREF(size);
    Py_XDECREF(shape);
    Py_XDECREF(numel);
    Py_XDECREF(is_cpu);
    Py_XDECREF(device);
    Py_XDECREF(grad);
    return row;
}

/* A bool, int, float or str itself (no subclass): describe_value caches these, and no such object is a tensor */
static int is_scalar(PyObject *leaf)
{
    return PyFloat_CheckExact(leaf) || PyLong_CheckExact(leaf) || PyBool_Check(leaf) || PyUnicode_CheckExact(leaf);
}

static PyObject *value_row(PyObject *k, PyObject *name, PyObject *io, PyObject *path, PyObject *is_kwarg,
                           PyObject *leaf, PyObject *ctx)
{
    PyObject *nan = PyTuple_GET_ITEM(ctx, C_NAN);
    if (leaf == Py_None)
        return PyTuple_Pack(ROW_ARITY, k, name, io, path, is_kwarg, k_none, k_zero, Py_None, nan, k_zero, nan, k_minus_one,
                            s_empty, s_empty, nan, s_empty);
    PyObject *d = NULL, *kind = (PyObject *)Py_TYPE(leaf);
    if (is_scalar(leaf)) {  /* describe_value's own cache first: (type, value) -> (type name, text) */
        PyObject *key = PyTuple_Pack(2, kind, leaf);
        if (key == NULL)
            return NULL;
        d = PyDict_GetItemWithError(PyTuple_GET_ITEM(ctx, C_SCALAR_TEXT), key);
        Py_DECREF(key);
        if (d == NULL && PyErr_Occurred())
            return NULL;
        Py_XINCREF(d);
    }
    if (d == NULL)
        d = PyObject_CallOneArg(PyTuple_GET_ITEM(ctx, C_DESCRIBE), leaf);
    if (d == NULL)
        return NULL;
    PyObject *row = NULL;
    if (PyTuple_CheckExact(d) && PyTuple_GET_SIZE(d) == 2)
        row = PyTuple_Pack(ROW_ARITY, k, name, io, path, is_kwarg, k_value, k_zero, Py_None, nan, k_zero, nan, k_minus_one,
                           PyTuple_GET_ITEM(d, 0), PyTuple_GET_ITEM(d, 1), nan, s_empty);
    else
        PyErr_SetString(PyExc_TypeError, "describe() must return (type name, text)");
    Py_DECREF(d);
    return row;
}

/* What every leaf of one add_rows call shares. */
typedef struct {
    PyObject *rows, *k, *base, *io, *is_kwarg, *set_producer, *call, *seen, *ctx;
    Py_ssize_t added;
} Rows;

/* Append the row of one (path, leaf); -1 on error. */
static int add_leaf(Rows *r, PyObject *path, PyObject *leaf)
{
    PyObject *ctx = r->ctx, *plain = PyTuple_GET_ITEM(ctx, C_TENSOR_TYPES);
    PyObject *kind = (PyObject *)Py_TYPE(leaf);
    int fast = 0;  /* 1: a plain tensor, 2: None or a value, 0: the recorder's own Python code */
    if (PyUnicode_CheckExact(path)) {
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(plain); j++)
            if (kind == PyTuple_GET_ITEM(plain, j))
                fast = 1;
        if (!fast && (leaf == Py_None || is_scalar(leaf)))
            fast = 2;  /* isinstance() through torch.Tensor's metaclass costs more than the row itself */
        if (!fast) {
            int is_tensor = PyObject_IsInstance(leaf, PyTuple_GET_ITEM(ctx, C_TENSOR));
            if (is_tensor < 0)
                return -1;
            fast = is_tensor ? 0 : 2;
        }
    }
    PyObject *row;
    if (!fast) {
        row = PyObject_Vectorcall(PyTuple_GET_ITEM(ctx, C_ROW_OF),
                                  (PyObject *[]){r->k, r->base, r->io, path, r->is_kwarg, leaf, r->call,
                                                 r->set_producer}, 8, NULL);
    } else {
        PyObject *name;
        if (PyUnicode_GET_LENGTH(path) == 0) {
            name = r->base;
            Py_INCREF(name);
        } else {
            name = dotted((PyObject *[]){r->base, path}, 2);
            if (name == NULL)
                return -1;
        }
        row = fast == 1 ? tensor_row(r->k, name, r->io, path, r->is_kwarg, leaf, r->seen, r->call, r->set_producer, ctx)
                        : value_row(r->k, name, r->io, path, r->is_kwarg, leaf, ctx);
        Py_DECREF(name);
    }
    if (row == NULL)
        return -1;
    int failed = PyList_Append(r->rows, row);
    Py_DECREF(row);
    if (!failed)
        r->added++;
    return failed ? -1 : 0;
}

/* Append the rows of every (path, leaf) pair an iterable yields (leaves() or walk() in Python). */
static int add_pairs(Rows *r, PyObject *pairs)
{
    PyObject *it = PyObject_GetIter(pairs);
    if (it == NULL)
        return -1;
    PyObject *pair;
    int failed = 0;
    while (!failed && (pair = PyIter_Next(it)) != NULL) {
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "leaves must be (path, leaf) pairs");
            failed = 1;
        } else {
            failed = add_leaf(r, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)) < 0;
        }
        Py_DECREF(pair);
    }
    Py_DECREF(it);
    return failed || PyErr_Occurred() ? -1 : 0;
}

/* An exact list or tuple nested in a call's arguments at path (a foreach op's lists of tensors: hundreds of
   leaves in one argument), walked here as leaves.walk(seq, path, 1) walks it: its elements at depth 2, paths
   "path.i" ("i" under an empty path). Plain tensors, None and other non-containers are leaves; an element that
   is itself a list, tuple or dict goes through walk(element, its path, 2), so namedtuples, torch.Size and
   deeper nesting keep walk's rules. */
static int add_sequence(Rows *r, PyObject *path, PyObject *seq_in)
{
    PyObject *ctx = r->ctx, *tensor = PyTuple_GET_ITEM(ctx, C_TENSOR);
    PyObject *seq = PySequence_Fast(seq_in, "");  /* the same object, held; a list's size is read each time */
    if (seq == NULL)
        return -1;
    int has_path = PyUnicode_GET_LENGTH(path) > 0, failed = 0;
    for (Py_ssize_t i = 0; !failed && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(item);  /* a list may change while Python code runs for an item */
        PyObject *sub = indexed(has_path ? path : NULL, i);
        if (sub == NULL)
            failed = 1;
        else if ((PyObject *)Py_TYPE(item) != tensor && item != Py_None
                 && (PyList_Check(item) || PyTuple_Check(item) || PyDict_Check(item))) {
            PyObject *pairs = PyObject_CallFunction(PyTuple_GET_ITEM(ctx, C_WALK), "OOi", item, sub, 2);
            failed = pairs == NULL || add_pairs(r, pairs) < 0;
            Py_XDECREF(pairs);
        } else
            failed = add_leaf(r, sub, item) < 0;
        Py_XDECREF(sub);
        Py_DECREF(item);
    }
    Py_DECREF(seq);
    return failed ? -1 : 0;
}

/* One item of a flat list, tuple or dict at path: a leaf, or a nested container walked as leaves.walk walks
   it, as leaves.leaves() does it (a torch.Size is a leaf): exact lists and tuples here, others by walk. */
static int add_item(Rows *r, PyObject *path, PyObject *item)
{
    PyObject *ctx = r->ctx;
    if (PyList_CheckExact(item) || PyTuple_CheckExact(item))
        return add_sequence(r, path, item);
    if ((PyObject *)Py_TYPE(item) != PyTuple_GET_ITEM(ctx, C_TENSOR) && item != Py_None
        && (PyList_Check(item) || PyTuple_Check(item) || PyDict_Check(item))) {
        int size = PyObject_IsInstance(item, PyTuple_GET_ITEM(ctx, C_SIZE_TYPE));
        if (size < 0)
            return -1;
        if (!size) {
            PyObject *pairs = PyObject_CallFunction(PyTuple_GET_ITEM(ctx, C_WALK), "OOi", item, path, 1);
            if (pairs == NULL)
                return -1;
            int failed = add_pairs(r, pairs);
            Py_DECREF(pairs);
            return failed;
        }
    }
    return add_leaf(r, path, item);
}

/* The rows of value: a flat list, tuple or dict is walked here as leaves.leaves() walks it (paths "0", "1"
   or keys, under prefix), anything else through leaves() itself. */
static int add_value(Rows *r, PyObject *value, PyObject *prefix)
{
    PyObject *ctx = r->ctx, *pos = PyTuple_GET_ITEM(ctx, C_POS);
    int has_prefix = PyUnicode_GET_LENGTH(prefix) > 0;
    if (PyList_CheckExact(value) || PyTuple_CheckExact(value)) {
        PyObject *seq = PySequence_Fast(value, "");  /* the same object, held; a list's size is read each time */
        if (seq == NULL)
            return -1;
        int failed = 0;
        for (Py_ssize_t i = 0; !failed && i < PySequence_Fast_GET_SIZE(seq); i++) {
            PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
            Py_INCREF(item);  /* a list may change while Python code runs for an item */
            PyObject *path;
            if (!has_prefix && i < PyTuple_GET_SIZE(pos)) {
                path = PyTuple_GET_ITEM(pos, i);
                Py_INCREF(path);
            } else {
                path = indexed(has_prefix ? prefix : NULL, i);
            }
            failed = path == NULL || add_item(r, path, item) < 0;
            Py_XDECREF(path);
            Py_DECREF(item);
        }
        Py_DECREF(seq);
        return failed ? -1 : 0;
    }
    if (PyDict_CheckExact(value)) {
        PyObject *items = PyDict_Items(value);  /* a snapshot: Python code may run for an item */
        if (items == NULL)
            return -1;
        int failed = 0;
        for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(items); i++) {
            PyObject *kv = PyList_GET_ITEM(items, i), *key = PyTuple_GET_ITEM(kv, 0);
            PyObject *path;
            if (has_prefix) {  /* f"{prefix}.{key}" */
                PyObject *text = PyObject_Format(key, s_empty);
                path = text == NULL ? NULL : dotted((PyObject *[]){prefix, text}, 2);
                Py_XDECREF(text);
            } else if (PyUnicode_CheckExact(key)) {
                path = key;
                Py_INCREF(path);
            } else {
                path = PyObject_Str(key);
            }
            failed = path == NULL || add_item(r, path, PyTuple_GET_ITEM(kv, 1)) < 0;
            Py_XDECREF(path);
        }
        Py_DECREF(items);
        return failed ? -1 : 0;
    }
    /* one leaf (a gradient's row is one tensor or None): leaves() gives [(prefix, value)] for anything but a list,
       tuple or dict, and for a torch.Size; what remains (a namedtuple, a subclass) goes through leaves() */
    int leaf = !(PyList_Check(value) || PyTuple_Check(value) || PyDict_Check(value));
    if (!leaf && PyTuple_Check(value) && (leaf = PyObject_IsInstance(value, PyTuple_GET_ITEM(ctx, C_SIZE_TYPE))) < 0)
        return -1;
    if (leaf)
        return add_leaf(r, prefix, value);
    PyObject *pairs = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(ctx, C_LEAVES), value, prefix, NULL);
    if (pairs == NULL)
        return -1;
    int failed = add_pairs(r, pairs);
    Py_DECREF(pairs);
    return failed;
}

/* build_rows(rows, value, prefix, k, base, io, is_kwarg, set_producer, call, seen, ctx) -> rows appended: one
   row per leaf of value (leaves.leaves(value, prefix)), as Recorder.add_rows' Python loop appends them. */
static PyObject *build_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "build_rows() takes 11 arguments");
        return NULL;
    }
    PyObject *ctx = args[10];
    if (!PyList_CheckExact(args[0]) || !PyUnicode_Check(args[2]) || !PyUnicode_Check(args[4]) || !PyDict_Check(args[9])
        || !PyTuple_CheckExact(ctx) || PyTuple_GET_SIZE(ctx) != C_SIZE || !PyDict_Check(PyTuple_GET_ITEM(ctx, C_DTYPE_CODES))
        || !PyDict_CheckExact(PyTuple_GET_ITEM(ctx, C_SCALAR_TEXT))
        || !(PyTuple_GET_ITEM(ctx, C_HOST_COPY) == Py_None
             || (PyTuple_CheckExact(PyTuple_GET_ITEM(ctx, C_HOST_COPY)) && PyTuple_GET_SIZE(PyTuple_GET_ITEM(ctx, C_HOST_COPY)) == 3))
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(ctx, C_TENSOR_TYPES)) || !PyTuple_CheckExact(PyTuple_GET_ITEM(ctx, C_POS))
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(ctx, C_INT_DTYPES)) || PyTuple_GET_SIZE(PyTuple_GET_ITEM(ctx, C_INT_DTYPES)) != 6) {
        PyErr_SetString(PyExc_TypeError, "build_rows() got arguments of the wrong types");
        return NULL;
    }
    int producer = PyObject_IsTrue(args[7]);
    if (producer < 0)
        return NULL;
    Rows r = {args[0], args[3], args[4], args[5], args[6], producer ? Py_True : Py_False, args[8], args[9], ctx, 0};
    int failed = add_value(&r, args[1], args[2]);
    return failed ? NULL : PyLong_FromSsize_t(r.added);
}

/* A number of a row as a double (what numpy.array(..., float64) makes of it): 0 on success, -1 with an error set
   (the caller then takes the Python path, which says what was wrong). */
static int as_double(PyObject *v, double *out)
{
    if (PyFloat_CheckExact(v)) {
        *out = PyFloat_AS_DOUBLE(v);
        return 0;
    }
    if (PyLong_Check(v)) { /* bool too */
        double d = PyLong_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
        *out = d;
        return 0;
    }
    if (PyFloat_Check(v)) {
        *out = PyFloat_AS_DOUBLE(v);
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, "split_rows: a numeric field holds neither an int nor a float");
    return -1;
}

/* split_rows(rows, numeric, out): the step's rows as columns in one pass (Recorder.materialize's zip(*rows) and
   its numeric conversions): the fields whose indices are in numeric are written as float64 into out (a writable
   buffer of len(numeric) * len(rows) doubles, field after field), every other field comes back as a list; the
   result has one entry per field, None for the numeric ones. */
static PyObject *split_rows(PyObject *self, PyObject *args)
{
    PyObject *rows, *numeric;
    Py_buffer out;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!w*", &PyList_Type, &rows, &PyTuple_Type, &numeric, &out))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows), m = PyTuple_GET_SIZE(numeric), width = ROW_ARITY;
    PyObject *cols = NULL;
    int slot[ROW_ARITY]; /* each field's row in out, or -1 */
    for (Py_ssize_t f = 0; f < width; f++)
        slot[f] = -1;
    if (out.len != m * n * (Py_ssize_t)sizeof(double) || (out.itemsize != 1 && out.itemsize != sizeof(double))) {
        PyErr_SetString(PyExc_ValueError, "split_rows() needs an output buffer of len(numeric) * len(rows) doubles");
        goto fail;
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        Py_ssize_t f = PyLong_AsSsize_t(PyTuple_GET_ITEM(numeric, j));
        if (f < 0 || f >= width) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "split_rows(): a numeric field index out of the row");
            goto fail;
        }
        slot[f] = (int)j;
    }
    cols = PyList_New(width);
    if (cols == NULL)
        goto fail;
    for (Py_ssize_t f = 0; f < width; f++) {
        PyObject *col = slot[f] >= 0 ? Py_NewRef(Py_None) : PyList_New(n);
        if (col == NULL)
            goto fail;
        PyList_SET_ITEM(cols, f, col);
    }
    double *dst = (double *)out.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != width) {
            PyErr_SetString(PyExc_TypeError, "split_rows(): every row must be a tuple of the row's fields");
            goto fail;
        }
        for (Py_ssize_t f = 0; f < width; f++) {
            PyObject *v = PyTuple_GET_ITEM(row, f);
            if (slot[f] < 0)
                PyList_SET_ITEM(PyList_GET_ITEM(cols, f), i, Py_NewRef(v));
            else if (as_double(v, dst + (Py_ssize_t)slot[f] * n + i) < 0)
                goto fail;
        }
    }
    PyBuffer_Release(&out);
    return cols;
fail:
    Py_XDECREF(cols);
    PyBuffer_Release(&out);
    return NULL;
}

/* attr_columns(objs, names): [[getattr(o, name) for o in objs] for name in names], the Call fields of a step's
   calls (Recorder.materialize) read at their slots where the objects' type has them (_slot_attrs.h). */
#define ATTR_COLUMNS_MAX 32
static SlotCache attr_caches[ATTR_COLUMNS_MAX];
static PyObject *attr_names[ATTR_COLUMNS_MAX]; /* the name each cache above was filled for (a strong reference) */

static PyObject *attr_columns(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *objs, *names;
    if (!PyArg_ParseTuple(args, "O!O!:attr_columns", &PyList_Type, &objs, &PyTuple_Type, &names))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(objs), k = PyTuple_GET_SIZE(names);
    if (k > ATTR_COLUMNS_MAX) {
        PyErr_Format(PyExc_ValueError, "attr_columns() takes at most %d names", ATTR_COLUMNS_MAX);
        return NULL;
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *name = PyTuple_GET_ITEM(names, j);
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "attr_columns(): the names must be strings");
            return NULL;
        }
        if (attr_names[j] == NULL || PyUnicode_Compare(attr_names[j], name) != 0) {
            if (PyErr_Occurred())
                return NULL;
            Py_XSETREF(attr_names[j], Py_NewRef(name));
            attr_caches[j].type = NULL; /* filled again for this name */
        }
    }
    PyObject *out = PyList_New(k);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *col = PyList_New(n);
        if (col == NULL)
            goto fail;
        PyList_SET_ITEM(out, j, col);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(objs, i);
        Py_INCREF(o); /* a getter may run Python code that changes the list */
        for (Py_ssize_t j = 0; j < k; j++) {
            PyObject *v = slot_get(o, attr_names[j], &attr_caches[j]);
            if (v == NULL) {
                Py_DECREF(o);
                goto fail;
            }
            PyList_SET_ITEM(PyList_GET_ITEM(out, j), i, v);
        }
        Py_DECREF(o);
        if (PyList_GET_SIZE(objs) != n) {
            PyErr_SetString(PyExc_RuntimeError, "attr_columns(): the list changed size while it was read");
            goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out); /* unfilled items are NULL, which a list's dealloc skips */
    return NULL;
}

static PyMethodDef methods[] = {
    {"attr_columns", attr_columns, METH_VARARGS,
     "attr_columns(objs, names): [[getattr(o, name) for o in objs] for name in names], slots read at their offsets."},
    {"split_rows", split_rows, METH_VARARGS,
     "split_rows(rows, numeric, out): the rows as columns, the numeric fields as float64 into out, the others as"
     " lists (None in their place for the numeric ones)."},
    {"build_rows", (PyCFunction)(void (*)(void))build_rows, METH_FASTCALL,
     "build_rows(rows, value, prefix, k, base, io, is_kwarg, set_producer, call, seen, ctx) appends the rows of"
     " the leaves of value, as Recorder.add_rows does, and returns how many."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_row_builder",
                                    "The recorder's rows of plain tensors, None and values, built in C.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__row_builder(void)
{
    s_version = PyUnicode_InternFromString("_version");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_shape = PyUnicode_InternFromString("shape");
    s_numel = PyUnicode_InternFromString("numel");
    shapes_seen = PyDict_New();
    s_is_cpu = PyUnicode_InternFromString("is_cpu");
    s_requires_grad = PyUnicode_InternFromString("requires_grad");
    s_empty = PyUnicode_InternFromString("");
    s_layout = PyUnicode_InternFromString("layout");
    s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    s_stride = PyUnicode_InternFromString("stride");
    s_is_neg = PyUnicode_InternFromString("is_neg");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_values = PyUnicode_InternFromString("_values");
    s_flat = PyUnicode_InternFromString("_flat");
    s_next_id = PyUnicode_InternFromString("_next_tensor_id");
    s_tensors = PyUnicode_InternFromString("tensors");
    k_one = PyLong_FromLong(1);
    k_tensor = PyLong_FromLong(KIND_TENSOR);
    k_none = PyLong_FromLong(KIND_NONE);
    k_value = PyLong_FromLong(KIND_VALUE);
    k_zero = PyLong_FromLong(0);
    k_minus_one = PyLong_FromLong(-1);
    if (!s_version || !s_dtype || !s_shape || !s_numel || !shapes_seen || !s_is_cpu || !s_requires_grad || !s_empty
        || !k_tensor || !k_none || !k_value || !k_zero || !k_minus_one || !k_one || !s_layout || !s_is_contiguous || !s_stride
        || !s_is_neg || !s_data_ptr || !s_values || !s_flat || !s_next_id || !s_tensors)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    /* the layout this build expects, read and checked once by the Python side */
    PyObject *fields = PyTuple_New(C_SIZE);
    PyObject *kinds = Py_BuildValue("{sisisi}", "tensor", KIND_TENSOR, "none", KIND_NONE, "value", KIND_VALUE);
    for (Py_ssize_t i = 0; fields != NULL && i < C_SIZE; i++) {
        PyObject *name = PyUnicode_FromString(CONTEXT_NAMES[i]);
        if (name == NULL) {
            Py_CLEAR(fields);
            break;
        }
        PyTuple_SET_ITEM(fields, i, name);
    }
    if (fields == NULL || kinds == NULL || PyModule_AddIntConstant(m, "ABI", MSPROBE_NB_STATS_ABI) < 0
        || PyModule_AddIntConstant(m, "ROW_ARITY", ROW_ARITY) < 0 || PyModule_AddIntConstant(m, "SEEN_ARITY", SEEN_ARITY) < 0
        || PyModule_AddObjectRef(m, "CONTEXT_FIELDS", fields) < 0
        || PyModule_AddObjectRef(m, "KIND_CODES", kinds) < 0) {
        Py_XDECREF(fields);
        Py_XDECREF(kinds);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(fields);
    Py_DECREF(kinds);
    return m;
}
