/* Packing a step's new rows into the records of a column group's tail (store/hdf5_appends.py, ColumnGroup).
 *
 * pack(out, itemsize, start, fields): out is a writable C-contiguous buffer of n records of `itemsize` bytes (its
 * length n * itemsize); fields is a tuple of (offset, column), each column a C-contiguous
 * buffer of plain numbers. Record r takes column[start + r] at its offset, for r in 0..n-1: one call for all
 * the fields, where numpy's field by field assignment cost a Python call and a cast lookup per column (34 for
 * the calls table), which a step with few rows pays in full. The caller hands over
 * columns whose bytes are the record's fields (same width, little-endian machine); anything else stays with
 * numpy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    Py_ssize_t offset, size;
    const char *src;
} Field;

static PyObject *pack(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer out;
    Py_ssize_t itemsize, start;
    PyObject *fields;
    if (!PyArg_ParseTuple(args, "w*nnO!", &out, &itemsize, &start, &PyTuple_Type, &fields))
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(fields), n = itemsize > 0 && out.len % itemsize == 0 ? out.len / itemsize : -1;
    Py_buffer *views = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_buffer));
    Field *fs = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Field));
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (views == NULL || fs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (n < 0 || !PyBuffer_IsContiguous(&out, 'C') || start < 0) {
        PyErr_SetString(PyExc_ValueError, "pack() needs a C-contiguous buffer of whole records and a start >= 0");
        goto done;
    }
    for (; got < k; got++) {
        PyObject *f = PyTuple_GET_ITEM(fields, got);
        if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != 2) {
            PyErr_SetString(PyExc_TypeError, "each field must be an (offset, column) pair");
            goto done;
        }
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GET_ITEM(f, 0));
        if (off == -1 && PyErr_Occurred())
            goto done;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(f, 1), &views[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
        Py_ssize_t size = views[got].itemsize;
        if (off < 0 || size < 1 || off > itemsize - size || views[got].len / size < start + n) {
            PyErr_Format(PyExc_ValueError, "field %zd (offset %zd, %zd bytes, %zd values) does not fit records of "
                         "%zd bytes from row %zd for %zd rows", got, off, size, views[got].len / size, itemsize,
                         start, n);
            got++;
            goto done;
        }
        fs[got] = (Field){off, size, (const char *)views[got].buf + start * size};
    }
    for (Py_ssize_t j = 0; j < k; j++) { /* a field at a time, its size fixed in each loop: plain moves */
        char *dst = (char *)out.buf + fs[j].offset;
        const char *src = fs[j].src;
        Py_ssize_t size = fs[j].size;
        switch (size) {
        case 8: for (Py_ssize_t r = 0; r < n; r++) memcpy(dst + r * itemsize, src + r * 8, 8); break;
        case 4: for (Py_ssize_t r = 0; r < n; r++) memcpy(dst + r * itemsize, src + r * 4, 4); break;
        case 2: for (Py_ssize_t r = 0; r < n; r++) memcpy(dst + r * itemsize, src + r * 2, 2); break;
        case 1: for (Py_ssize_t r = 0; r < n; r++) dst[r * itemsize] = src[r]; break;
        default: for (Py_ssize_t r = 0; r < n; r++) memcpy(dst + r * itemsize, src + r * size, (size_t)size);
        }
    }
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t j = 0; j < got; j++)
        if (views[j].obj != NULL)
            PyBuffer_Release(&views[j]);
    PyMem_Free(views);
    PyMem_Free(fs);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS,
     "pack(out, itemsize, start, fields): record r of out (whole records of itemsize bytes) takes "
     "column[start + r] at its offset, for each (offset, column) in fields."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pack_records",
                                    "A column group's new rows packed into records, one record at a time.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__pack_records(void)
{
    return PyModule_Create(&module);
}
