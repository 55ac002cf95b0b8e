/* msprobe_nb.store._chunk_codec: a whole chunk of a calls-table column, encoded as HDF5's filter pipeline of
   that column (bitshuffle + LZ4, HDF5 filter 32008, then HDF5's fletcher32) would store it, so that the writer
   hands HDF5 the finished bytes (H5Dwrite_chunk) instead of a chunk to pass through its chunk buffer and filters.

   The bit transpose and LZ4 are bitshuffle's own, from the library that HDF5 runs as the filter: bind() takes
   the addresses of its exported bshuf_compress_lz4, bshuf_compress_lz4_bound and bshuf_default_block_size.
   What the filter adds around them is this module's: a 12-byte header (the chunk's size in bytes as a big-endian
   uint64, the block size in bytes as a big-endian uint32) before the compressed blocks, and after them the
   fletcher32 checksum of everything before it, little-endian, as HDF5's fletcher32 filter appends it.
   tests/test_hdf5_chunk_codec.py holds the bytes equal to those HDF5 writes through its filters. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define CHUNK_CODEC_ABI 1
#define HEADER_BYTES 12

typedef int64_t (*compress_fn)(const void *in, void *out, size_t size, size_t elem_size, size_t block_size);
typedef size_t (*bound_fn)(size_t size, size_t elem_size, size_t block_size);
typedef size_t (*block_fn)(size_t elem_size);

static compress_fn lz4_compress;
static bound_fn lz4_bound;
static block_fn default_block;

/* Fletcher's checksum over 16-bit big-endian words, as HDF5 defines it: both sums start at 0, are folded to 16
   bits after every 360 words (the most that cannot overflow 32 bits) and once more at the end; an odd last byte
   is the high half of one more word. */
static uint32_t fletcher32_of(const uint8_t *p, size_t nbytes)
{
    uint32_t a = 0, b = 0;
    size_t words = nbytes / 2;
    while (words > 0) {
        size_t run = words < 360 ? words : 360;
        words -= run;
        for (size_t i = 0; i < run; i++, p += 2) {
            a += ((uint32_t)p[0] << 8) | p[1];
            b += a;
        }
        a = (a & 0xffff) + (a >> 16);
        b = (b & 0xffff) + (b >> 16);
    }
    if (nbytes & 1) {
        a += (uint32_t)p[0] << 8;
        b += a;
        a = (a & 0xffff) + (a >> 16);
        b = (b & 0xffff) + (b >> 16);
    }
    a = (a & 0xffff) + (a >> 16);
    b = (b & 0xffff) + (b >> 16);
    return (b << 16) | a;
}

static void put_be(uint8_t *out, uint64_t v, int nbytes)
{
    for (int i = nbytes - 1; i >= 0; i--, v >>= 8)
        out[i] = (uint8_t)(v & 0xff);
}

static void *address(PyObject *v)
{
    void *p = PyLong_AsVoidPtr(v);
    if (p == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "bind(): a function address is 0");
    return p;
}

/* bind(compress, bound, default_block): the three bitshuffle functions' addresses (ints) */
static PyObject *bind(PyObject *self, PyObject *args)
{
    PyObject *c, *b, *d;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOO", &c, &b, &d))
        return NULL;
    void *pc = address(c), *pb = pc ? address(b) : NULL, *pd = pb ? address(d) : NULL;
    if (pd == NULL)
        return NULL;
    lz4_compress = (compress_fn)pc;
    lz4_bound = (bound_fn)pb;
    default_block = (block_fn)pd;
    Py_RETURN_NONE;
}

/* encode(buffer, elem_size): the chunk's stored bytes, checksum included (a C-contiguous buffer of whole
   elements) */
static PyObject *encode(PyObject *self, PyObject *args)
{
    Py_buffer in;
    Py_ssize_t elem;
    (void)self;
    if (lz4_compress == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "encode(): bind() the bitshuffle library first");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*n", &in, &elem))
        return NULL;
    PyObject *out = NULL;
    if (elem <= 0 || in.len % elem != 0 || in.len == 0) {
        PyErr_Format(PyExc_ValueError, "encode(): %zd bytes are not a whole number of %zd-byte elements", in.len,
                     elem);
        goto done;
    }
    size_t n = (size_t)(in.len / elem), block = default_block((size_t)elem);
    size_t cap = HEADER_BYTES + lz4_bound(n, (size_t)elem, 0) + 4;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
    if (out == NULL)
        goto done;
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
    put_be(dst, (uint64_t)in.len, 8);
    put_be(dst + 8, (uint64_t)(block * (size_t)elem), 4);
    int64_t made;
    Py_BEGIN_ALLOW_THREADS
    made = lz4_compress(in.buf, dst + HEADER_BYTES, n, (size_t)elem, 0);
    Py_END_ALLOW_THREADS
    if (made < 0 || (size_t)made > cap - HEADER_BYTES - 4) {
        PyErr_Format(PyExc_RuntimeError, "encode(): bitshuffle failed (code %lld)", (long long)made);
        Py_CLEAR(out);
        goto done;
    }
    size_t total = HEADER_BYTES + (size_t)made;
    uint32_t sum = fletcher32_of(dst, total);
    for (int i = 0; i < 4; i++)
        dst[total + i] = (uint8_t)(sum >> (8 * i));
    _PyBytes_Resize(&out, (Py_ssize_t)(total + 4));
done:
    PyBuffer_Release(&in);
    return out;
}

/* fletcher32(buffer): HDF5's checksum of the bytes */
static PyObject *fletcher32(PyObject *self, PyObject *arg)
{
    Py_buffer in;
    (void)self;
    if (PyObject_GetBuffer(arg, &in, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t sum = fletcher32_of((const uint8_t *)in.buf, (size_t)in.len);
    PyBuffer_Release(&in);
    return PyLong_FromUnsignedLong(sum);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(compress, bound, default_block): bitshuffle's functions, by address"},
    {"encode", encode, METH_VARARGS, "encode(buffer, elem_size) -> the chunk as the filters store it"},
    {"fletcher32", fletcher32, METH_O, "fletcher32(buffer) -> HDF5's fletcher32 checksum of the bytes"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chunk_codec",
                                    "A column chunk encoded as its HDF5 filters would store it.", -1, methods};

PyMODINIT_FUNC PyInit__chunk_codec(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", CHUNK_CODEC_ABI) < 0)
        Py_CLEAR(m);
    return m;
}
