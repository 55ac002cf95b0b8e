/* Dotted names built the way the recorder's Python side writes them (f"{a}.{b}", f"{prefix}.{i}"), without
 * PyUnicode_FromFormat: that parses its format and goes through a writer for every name, and a recorded call
 * makes several (its name, its rows' base, each row's name, each positional leaf's path).
 *
 * dotted(parts, n): the parts, each a str, joined by "."; exact ASCII strs are copied into one new string,
 * anything else goes through PyUnicode_Join, so the result is always the str that ".".join() gives.
 * index_text(i): str(i), the strings of 0..INDEX_TEXTS-1 made once per translation unit and shared;
 * indexed(path, i): f"{path}.{i}" from them.
 */
#ifndef MSPROBE_NB_DOTTED_NAMES_H
#define MSPROBE_NB_DOTTED_NAMES_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define INDEX_TEXTS 1024

static PyObject *index_texts[INDEX_TEXTS];

/* str(i): a new reference; NULL with an exception set on error */
static inline PyObject *index_text(Py_ssize_t i)
{
    if (i >= 0 && i < INDEX_TEXTS) {
        if (index_texts[i] == NULL) {
            index_texts[i] = PyUnicode_FromFormat("%zd", i);
            if (index_texts[i] == NULL)
                return NULL;
        }
        return Py_NewRef(index_texts[i]);
    }
    return PyUnicode_FromFormat("%zd", i);
}

/* str(v) of a counter: the shared strings where v is a small non-negative int itself */
static inline PyObject *count_text(PyObject *v)
{
    if (PyLong_CheckExact(v)) {
        Py_ssize_t i = PyLong_AsSsize_t(v);
        if (i == -1 && PyErr_Occurred())
            PyErr_Clear();
        else if (i >= 0 && i < INDEX_TEXTS)
            return index_text(i);
    }
    return PyObject_Str(v);
}

/* ".".join(parts[:n]) for strs: a new reference; NULL with an exception set on error */
static inline PyObject *dotted(PyObject *const *parts, Py_ssize_t n)
{
    Py_ssize_t len = n > 0 ? n - 1 : 0;
    int ascii = 1;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!PyUnicode_Check(parts[j])) {
            PyErr_Format(PyExc_TypeError, "a dotted name's part must be a str, not %.100s", Py_TYPE(parts[j])->tp_name);
            return NULL;
        }
        if (PyUnicode_READY(parts[j]) < 0)
            return NULL;
        ascii &= PyUnicode_CheckExact(parts[j]) && PyUnicode_IS_ASCII(parts[j]); /* else: PyUnicode_Join's own way */
        len += PyUnicode_GET_LENGTH(parts[j]);
    }
    if (!ascii) {
        PyObject *seq = PyTuple_New(n), *dot = seq != NULL ? PyUnicode_FromStringAndSize(".", 1) : NULL;
        PyObject *joined = NULL;
        if (dot != NULL) {
            for (Py_ssize_t j = 0; j < n; j++)
                PyTuple_SET_ITEM(seq, j, Py_NewRef(parts[j]));
            joined = PyUnicode_Join(dot, seq);
        }
        Py_XDECREF(dot);
        Py_XDECREF(seq);
        return joined;
    }
    PyObject *out = PyUnicode_New(len, 127);
    if (out == NULL)
        return NULL;
    Py_UCS1 *w = PyUnicode_1BYTE_DATA(out);
    for (Py_ssize_t j = 0; j < n; j++) {
        if (j)
            *w++ = '.';
        Py_ssize_t k = PyUnicode_GET_LENGTH(parts[j]);
        memcpy(w, PyUnicode_1BYTE_DATA(parts[j]), (size_t)k);
        w += k;
    }
    return out;
}

/* f"{path}.{i}", or str(i) where path is NULL: the path of a sequence's item i */
static inline PyObject *indexed(PyObject *path, Py_ssize_t i)
{
    PyObject *text = index_text(i);
    if (text != NULL && path != NULL)
        Py_SETREF(text, dotted((PyObject *[]){path, text}, 2));
    return text;
}

#endif
