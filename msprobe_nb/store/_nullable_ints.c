/* msprobe_nb.store._nullable_ints: a nullable integer column handed over as float64 (NaN for "no value") made
   int64 in one pass, as column_values.nullable does it with numpy (isnan, where, astype, a comparison, any and a
   masked assignment: six passes and as many arrays for each column of a step). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#define NULLABLE_INTS_ABI 1

/* from_floats(values, na, out) -> -1, or the index of the first value that is not a whole number in int64's range
   (out is then partly written). values: a C-contiguous buffer of float64; out: a writable C-contiguous buffer of as
   many int64. NaN becomes na; every other value its integer. */
static PyObject *from_floats(PyObject *self, PyObject *args)
{
    Py_buffer in, out;
    long long na;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Lw*", &in, &na, &out))
        return NULL;
    Py_ssize_t n = in.len / (Py_ssize_t)sizeof(double), bad = -1;
    if (in.len % (Py_ssize_t)sizeof(double) != 0 || out.len != n * (Py_ssize_t)sizeof(int64_t)) {
        PyBuffer_Release(&in);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "from_floats() needs float64 values and an int64 buffer of as many");
        return NULL;
    }
    const double *x = (const double *)in.buf;
    int64_t *y = (int64_t *)out.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = x[i];
        if (isnan(v)) {
            y[i] = (int64_t)na;
        } else if (v >= -9223372036854775808.0 && v < 9223372036854775808.0 && (double)(int64_t)v == v) {
            y[i] = (int64_t)v;
        } else {  /* a fraction, an infinity or beyond int64 */
            bad = i;
            break;
        }
    }
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(bad);
}

static PyMethodDef methods[] = {
    {"from_floats", from_floats, METH_VARARGS,
     "from_floats(values, na, out) -> -1 or the index of the first value that is not an int64: float64 values into"
     " int64 out, NaN as na."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nullable_ints",
                                    "A nullable integer column given as float64 (NaN: no value) made int64 in one pass.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nullable_ints(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", NULLABLE_INTS_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
