/* msprobe_nb.store._column_ids: the ids of a string or shape column (the writer's interned tables), taken from the
   last step's conversion of the same column wherever a row holds the same value, else looked up in the table.

   A training loop hands the writer the same names, arguments and shapes step after step, but not all of them: the
   optimizer's step size is new text on some rows of every step, so a whole-column comparison with the last step
   misses and every row went back to the table (a dict lookup and a conversion per row). Here a row that equals the
   last step's row at its index keeps its id; only the others are looked up, and those the table lacks are left to
   the writer, which interns them. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define COLUMN_IDS_ABI 1

/* 1 where a and b are the same value as the last step's comparison took them (identity, or equal str or tuple
   objects of exactly those types), 0 where not, -1 on error. Other types count as different, to be looked up. */
static int same_value(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    if (Py_TYPE(a) != Py_TYPE(b) || !(PyUnicode_CheckExact(a) || PyTuple_CheckExact(a)))
        return 0;
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* ids(values, table, last_values, last_ids, out) -> the indices of the values the table lacks (a list of ints).
   values and last_values (or None) are lists; last_ids a buffer of int32 (one per last value); out a writable
   buffer of int32, one per value, where each id goes (-1 for those returned). A value's id is last_ids[i] where
   last_values[i] is the same value, else table[value] (an int). */
static PyObject *ids(PyObject *self, PyObject *args)
{
    PyObject *values, *table, *last, *last_ids_obj = NULL;
    Py_buffer last_ids = {0}, out;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!OOw*", &PyList_Type, &values, &PyDict_Type, &table, &last, &last_ids_obj, &out))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values), m = 0;
    int have_last = last != Py_None, held = 0;
    const char *problem = NULL;
    if (have_last && !PyList_CheckExact(last))
        problem = "ids() needs the last values as a list, or None";
    else if (out.len != n * (Py_ssize_t)sizeof(int32_t) || (out.itemsize != 1 && out.itemsize != sizeof(int32_t)))
        problem = "ids() needs an int32 buffer of one id per value";
    if (problem == NULL && have_last) {
        if (PyObject_GetBuffer(last_ids_obj, &last_ids, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            PyBuffer_Release(&out);
            return NULL;
        }
        held = 1;
        m = PyList_GET_SIZE(last);
        if (last_ids.len != m * (Py_ssize_t)sizeof(int32_t) || last_ids.itemsize != sizeof(int32_t))
            problem = "ids() needs one int32 id per last value";
    }
    PyObject *lacking = problem == NULL ? PyList_New(0) : NULL;
    if (problem != NULL)
        PyErr_SetString(PyExc_ValueError, problem);
    int32_t *dst = (int32_t *)out.buf;
    const int32_t *prev = held ? (const int32_t *)last_ids.buf : NULL;
    for (Py_ssize_t i = 0; lacking != NULL && i < n && i < PyList_GET_SIZE(values); i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        Py_INCREF(v);  /* a comparison or a hash may run Python code */
        int same = 0;
        if (have_last && i < PyList_GET_SIZE(last) && i < m) {
            PyObject *w = PyList_GET_ITEM(last, i);
            Py_INCREF(w);
            same = same_value(w, v);
            Py_DECREF(w);
        }
        if (same > 0) {
            dst[i] = prev[i];
        } else if (same == 0) {
            PyObject *id = PyDict_GetItemWithError(table, v);
            long k = id != NULL ? PyLong_AsLong(id) : -1;
            if (id == NULL && !PyErr_Occurred()) {
                PyObject *at = PyLong_FromSsize_t(i);
                if (at == NULL || PyList_Append(lacking, at) < 0)
                    Py_CLEAR(lacking);
                Py_XDECREF(at);
                dst[i] = -1;
            } else if (PyErr_Occurred() || k < INT32_MIN || k > INT32_MAX) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_OverflowError, "an id does not fit int32");
                Py_CLEAR(lacking);
            } else {
                dst[i] = (int32_t)k;
            }
        } else {
            Py_CLEAR(lacking);
        }
        Py_DECREF(v);
    }
    if (lacking != NULL && PyList_GET_SIZE(values) != n) {  /* changed by Python code a comparison ran */
        PyErr_SetString(PyExc_RuntimeError, "ids(): the values changed size while being read");
        Py_CLEAR(lacking);
    }
    if (held)
        PyBuffer_Release(&last_ids);
    PyBuffer_Release(&out);
    return lacking;
}

static PyMethodDef methods[] = {
    {"ids", ids, METH_VARARGS,
     "ids(values, table, last_values, last_ids, out) -> indices the table lacks: each value's int32 id into out,"
     " the last step's where the value at that index is the same, else the table's."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_column_ids",
                                    "A string or shape column's ids, from the last step's rows where they hold the same"
                                    " value, else from the writer's table.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__column_ids(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", COLUMN_IDS_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
