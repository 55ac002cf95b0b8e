/* One-pass statistics of a float32 CPU tensor's memory: max, min, sum and norm, read once (and of an
 * integer or bool tensor's: int_stats_at, below).
 *
 * Why: torch needs four reductions (four passes and four dispatches) for what a recorded tensor needs,
 * and inside a training step the dispatch, not the arithmetic, is most of the cost. This kernel reads the
 * values once while they are still in cache from the op that made them.
 *
 * Semantics follow a float32 torch reduction: a NaN makes max, min, sum and norm NaN; sums are
 * accumulated in float lanes folded into double every 512 elements, and rounded to float32 at the end;
 * a sum, or a sum of squares, beyond float32's range gives inf, as torch's float32 accumulation does.
 *
 * Portable C with GCC/Clang vector extensions (SSE or NEON, and an AVX2 clone on x86-64 Linux with
 * GCC). setup.py builds it as an optional extension: without a compiler, msprobe_nb uses torch's
 * reductions instead (msprobe_nb/capture/stats.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_stats_pass.h"

/* float32 rounding and torch's conventions: a sum beyond float32's range is inf; torch's norm is |x| for one
   element, and inf once the float32 sum of squares overflows; a NaN anywhere makes all four NaN */
static PyObject *result(const double out[4], int any_nan, Py_ssize_t n)
{
    if (any_nan)
        return Py_BuildValue("(dddd)", (double)NAN, (double)NAN, (double)NAN, (double)NAN);
    double norm = f32_norm(out[3], n, out[0]);
    return Py_BuildValue("(dddd)", out[0], out[1], (double)(float)out[2], (double)(float)norm);
}

/* The address of a contiguous float32 CPU tensor's first element (tensor.data_ptr()) and its element count,
   which the caller guarantees: msprobe_nb/capture/stats.py checks dtype, device, contiguity and the
   negative bit, and holds the tensor meanwhile. No buffer or numpy view is made for it. */
static PyObject *stats_at(PyObject *self, PyObject *args)
{
    Py_ssize_t address, n;
    double out[4];
    int any_nan;
    (void)self;
    if (!PyArg_ParseTuple(args, "nn", &address, &n))
        return NULL;
    if (address == 0 || n <= 0) {
        PyErr_SetString(PyExc_ValueError, "stats_at() needs an address and a positive count");
        return NULL;
    }
    if (n >= (1 << 18)) {  /* long enough to let other threads run meanwhile */
        Py_BEGIN_ALLOW_THREADS
        any_nan = stats_pass((const float *)address, n, out);
        Py_END_ALLOW_THREADS
    } else {
        any_nan = stats_pass((const float *)address, n, out);
    }
    return result(out, any_nan, n);
}

/* strided_stats_at(address, shape, strides): stats_at for a strided float32 view (a transpose, a slice, an
   expanded tensor): address its data_ptr(), shape and strides (in elements) as tensor.shape and tensor.stride()
   give them, which the caller takes from the tensor it holds (stats.py checks dtype, device and the negative
   bit). None for a layout the kernel does not read (a negative stride, more dimensions than it takes). */
static PyObject *strided_stats_at(PyObject *self, PyObject *args)
{
    Py_ssize_t address, n = 0;
    PyObject *shape, *strides;
    double out[4];
    (void)self;
    if (!PyArg_ParseTuple(args, "nOO", &address, &shape, &strides))
        return NULL;
    if (address == 0) {
        PyErr_SetString(PyExc_ValueError, "strided_stats_at() needs an address");
        return NULL;
    }
    int got = strided_pass_seq((const float *)address, shape, strides, &n, out);
    if (got == -2)
        return NULL;
    if (got < 0)
        Py_RETURN_NONE;
    return result(out, got, n);
}

/* counted_stats_at(address, shape, strides): the statistics of a float32 view that holds NaN or inf (stats_at
   or strided_stats_at found its max or min not finite), by torch's rules, with the counts torch's path makes:
   (max, min, sum, norm, NaN count, +inf count, -inf count). None for a layout it does not read. */
static PyObject *counted_stats_at(PyObject *self, PyObject *args)
{
    Py_ssize_t address, n = 0, size[STRIDED_MAX_DIMS], stride[STRIDED_MAX_DIMS];
    PyObject *shape, *strides;
    double out[7] = {0, 0, 0, 0, 0, 0, 0};
    int ndim = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "nOO", &address, &shape, &strides))
        return NULL;
    if (address == 0) {
        PyErr_SetString(PyExc_ValueError, "counted_stats_at() needs an address");
        return NULL;
    }
    int got = parse_layout(shape, strides, size, stride, &ndim, &n);
    if (got == -2)
        return NULL;
    if (got == 0) {
        Py_BEGIN_ALLOW_THREADS
        got = counted_pass((const float *)address, ndim, size, stride, out);
        Py_END_ALLOW_THREADS
    }
    if (got < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(ddddddd)", out[0], out[1], out[2], out[3], out[4], out[5], out[6]);
}

/* Sum of squares of n float32 values in double (float lanes folded every FOLD elements): a NaN or inf
   propagates through the arithmetic itself, as in torch's norm. */
MULTIVERSION static double sumsq_pass(const float *x, Py_ssize_t n)
{
    v8f zero = {0};
    double q = 0.0;
    Py_ssize_t i = 0;
    Py_ssize_t whole = n - n % BLOCK;
    while (i < whole) {
        v8f q0 = zero, q1 = zero, q2 = zero, q3 = zero;
        Py_ssize_t end = i + FOLD < whole ? i + FOLD : whole;
        for (; i < end; i += BLOCK) {
            v8f a, b, c, d;
            memcpy(&a, x + i, sizeof a);
            memcpy(&b, x + i + 8, sizeof b);
            memcpy(&c, x + i + 16, sizeof c);
            memcpy(&d, x + i + 24, sizeof d);
            q0 += a * a; q1 += b * b; q2 += c * c; q3 += d * d;
        }
        v8f qt = (q0 + q1) + (q2 + q3);
        for (int k = 0; k < 8; k++)
            q += qt[k];
    }
    for (; i < n; i++)
        q += (double)x[i] * x[i];
    return q;
}

/* norms_into(addresses, counts, out): the L2 norm of each run of counts[k] float32 values at addresses[k] (tensors'
   data_ptr(), contiguous float32 CPU tensors the caller holds), rounded to float32 as torch's norm is: |x| for
   one element, inf once the sum of squares passes float32's range. Written into out (a writable buffer of as
   many float32 as runs: a numpy array), so a model's many parameters cost one call and no Python float each. */
static PyObject *norms_into(PyObject *self, PyObject *args)
{
    PyObject *addresses, *counts;
    Py_buffer out;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!w*", &PyList_Type, &addresses, &PyList_Type, &counts, &out))
        return NULL;
    Py_ssize_t m = PyList_GET_SIZE(addresses);
    const char *why = NULL;
    if (PyList_GET_SIZE(counts) != m)
        why = "norms_into() needs as many counts as addresses";
    else if (out.len != m * (Py_ssize_t)sizeof(float) || (out.itemsize != 1 && out.itemsize != sizeof(float)))
        why = "norms_into() needs an output buffer of one float32 per address";
    float *dst = (float *)out.buf;
    for (Py_ssize_t k = 0; why == NULL && k < m; k++) {
        Py_ssize_t address = PyLong_AsSsize_t(PyList_GET_ITEM(addresses, k));
        Py_ssize_t n = PyLong_AsSsize_t(PyList_GET_ITEM(counts, k));
        if (PyErr_Occurred()) {
            PyBuffer_Release(&out);
            return NULL;
        }
        if (address == 0 || n <= 0) {
            why = "norms_into() needs addresses and positive counts";
            break;
        }
        const float *x = (const float *)address;
        double q = sumsq_pass(x, n);
        double norm = f32_norm(q, n, (double)x[0]);
        dst[k] = q != q ? NAN : (float)norm;
    }
    PyBuffer_Release(&out);
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* int_stats_at(address, n, code): code 0..4 = int64, int32, int16, int8, uint8 -> (max, min, sum, sum of
   squares); code 5 = bool -> (count of true, 0, 0, 0). The caller (stats.py) checks dtype, device and
   contiguity and holds the tensor meanwhile, as for stats_at. */
static PyObject *int_stats_at(PyObject *self, PyObject *args)
{
    Py_ssize_t address, n;
    int code;
    double out[4] = {0, 0, 0, 0};
    (void)self;
    if (!PyArg_ParseTuple(args, "nni", &address, &n, &code))
        return NULL;
    if (address == 0 || n <= 0 || code < 0 || code > 5) {
        PyErr_SetString(PyExc_ValueError, "int_stats_at() needs an address, a positive count and a code in 0..5");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    int_pass((const void *)address, n, code, out);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(dddd)", out[0], out[1], out[2], out[3]);
}

/* pack_stats(values, flat, out): the step's statistics into out (a writable buffer of 7 * len(values) doubles) in
   one pass, where numpy.array(values) would discover the nesting first. An entry is a 7-tuple of floats, or
   Ellipsis where the C row builder wrote its seven doubles into flat (a buffer of 7 doubles per entry, indexed as
   values, as long as its last such entry). True when every entry was one of these; False as soon as one is not
   (a device tensor, a staged entry): out then holds nothing of use and the caller converts the list itself. */
static PyObject *pack_stats(PyObject *self, PyObject *args)
{
    PyObject *values;
    Py_buffer flat, out;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!y*w*", &PyList_Type, &values, &flat, &out))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values), row = STATS_ROW_BYTES;
    const char *problem = NULL;
    if (out.len != n * row || (out.itemsize != 1 && out.itemsize != sizeof(double)))
        problem = "pack_stats() needs an output buffer of 7 doubles per entry";
    else if (flat.len % row != 0 || flat.len > n * row)
        problem = "pack_stats() needs a flat buffer of at most 7 doubles per entry";
    if (problem != NULL) {
        PyBuffer_Release(&flat);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    double *dst = (double *)out.buf;
    const char *src = (const char *)flat.buf;
    Py_ssize_t written = flat.len / row;
    int packed = 1;
    for (Py_ssize_t i = 0; packed && i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (v == Py_Ellipsis && i < written) {
            memcpy(dst + 7 * i, src + i * row, (size_t)row);
            continue;
        }
        if (!PyTuple_CheckExact(v) || PyTuple_GET_SIZE(v) != 7) {
            packed = 0;
            break;
        }
        for (Py_ssize_t j = 0; j < 7; j++) {
            PyObject *x = PyTuple_GET_ITEM(v, j);
            if (!PyFloat_CheckExact(x)) {
                packed = 0;
                break;
            }
            dst[7 * i + j] = PyFloat_AS_DOUBLE(x);
        }
    }
    PyBuffer_Release(&flat);
    PyBuffer_Release(&out);
    return PyBool_FromLong(packed);
}

static PyMethodDef methods[] = {
    {"pack_stats", pack_stats, METH_VARARGS,
     "pack_stats(values, flat, out): a list of 7-tuples of floats, or Ellipsis for a row of flat, into out (7 doubles"
     " each); False where an entry is neither."},
    {"stats_at", stats_at, METH_VARARGS,
     "stats_at(address, n) -> (max, min, sum, norm) of the n float32 values at address (a tensor's data_ptr()),"
     " in one pass."},
    {"strided_stats_at", strided_stats_at, METH_VARARGS,
     "strided_stats_at(address, shape, strides) -> (max, min, sum, norm) of a strided float32 view (a tensor's"
     " data_ptr(), shape and stride()), in one pass; None for a layout it does not read."},
    {"counted_stats_at", counted_stats_at, METH_VARARGS,
     "counted_stats_at(address, shape, strides) -> (max, min, sum, norm, NaN count, +inf count, -inf count) of a"
     " float32 view with NaN or inf, by torch's rules; None for a layout it does not read."},
    {"int_stats_at", int_stats_at, METH_VARARGS,
     "int_stats_at(address, n, code) -> (max, min, sum, sum of squares) of n integers at address (code 0-4:"
     " int64, int32, int16, int8, uint8), or (count of true, 0, 0, 0) of n bools (code 5)."},
    {"norms_into", norms_into, METH_VARARGS,
     "norms_into(addresses, counts, out) writes the float32 norm of each float32 run at addresses (tensors'"
     " data_ptr()) into out, one call."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fused_stats",
                                    "One-pass max, min, sum and norm of float32 and integer tensors' memory; many tensors' norms in one call.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fused_stats(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", MSPROBE_NB_STATS_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
