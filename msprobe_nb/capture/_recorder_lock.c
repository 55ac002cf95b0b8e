/* The recorder's reentrant lock, taken twice on every recorded call.
 *
 * threading.RLock's acquire() parses its (blocking, timeout) arguments with PyArg_ParseTupleAndKeywords even
 * when there are none: that parse is most of the cost of taking an uncontended lock, paid about a thousand
 * times in a recorded step. RecorderLock's acquire() takes the same arguments and parses nothing when given
 * none, as the recorder calls it. It is reentrant like RLock: the owning thread and
 * a count are kept beside a plain PyThread lock, and read and written only while the GIL is held, so a thread
 * that owns it takes it again by adding one. A thread that has to wait releases the GIL and waits in slices,
 * checking for signals between them, so Ctrl-C still interrupts it.
 *
 * Without this build the recorder uses threading.RLock (capture/recorder.py); tests/test_recorder_lock.py holds
 * the two to the same behaviour. Plain C over the CPython API; nothing here is compiled against torch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

/* ABI of this module; capture/c_contract.py's RECORDER_LOCK_ABI must match */
#define RECORDER_LOCK_ABI 1
/* how long one slice of a contended wait lasts before signals are checked, in microseconds */
#define WAIT_SLICE_US 50000

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    unsigned long owner; /* the owning thread's ident, meaningful while count > 0 */
    unsigned long count; /* how many times the owner holds it */
} RecorderLock;

static PyObject *RecorderLock_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kw != NULL && PyDict_GET_SIZE(kw) != 0)) {
        PyErr_SetString(PyExc_TypeError, "RecorderLock() takes no arguments");
        return NULL;
    }
    RecorderLock *self = (RecorderLock *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_MemoryError, "RecorderLock: cannot allocate a lock");
        return NULL;
    }
    self->owner = 0;
    self->count = 0;
    return (PyObject *)self;
}

static void RecorderLock_dealloc(RecorderLock *self)
{
    if (self->lock != NULL) {
        if (self->count > 0)
            PyThread_release_lock(self->lock); /* PyThread_free_lock must not be given a held lock */
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Take it, waiting up to timeout_us (-1: as long as it takes; 0: not at all): 1 taken, 0 not, -1 an error (a
 * signal handler raised while waiting). */
static int take(RecorderLock *self, long long timeout_us)
{
    unsigned long me = PyThread_get_thread_ident();
    if (self->count > 0 && self->owner == me) {
        if (self->count == ULONG_MAX) {
            PyErr_SetString(PyExc_OverflowError, "RecorderLock: taken too many times");
            return -1;
        }
        self->count++;
        return 1;
    }
    if (PyThread_acquire_lock(self->lock, NOWAIT_LOCK) != PY_LOCK_ACQUIRED) {
        for (;;) {
            if (timeout_us == 0)
                return 0;
            long long slice = timeout_us < 0 || timeout_us > WAIT_SLICE_US ? WAIT_SLICE_US : timeout_us;
            PyLockStatus r;
            Py_BEGIN_ALLOW_THREADS
            r = PyThread_acquire_lock_timed(self->lock, slice, 0);
            Py_END_ALLOW_THREADS
            if (r == PY_LOCK_ACQUIRED)
                break;
            if (PyErr_CheckSignals() < 0)
                return -1;
            if (timeout_us > 0)
                timeout_us -= slice;
        }
    }
    self->owner = me;
    self->count = 1;
    return 1;
}

/* acquire(blocking=True, timeout=-1), as RLock's; the recorder calls it with no arguments, which parses
 * nothing. Returns whether it was taken. */
static PyObject *RecorderLock_acquire(RecorderLock *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames)
{
    if (nargs == 0 && kwnames == NULL) {
        int r = take(self, -1);
        return r < 0 ? NULL : PyBool_FromLong(r);
    }
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *blocking = NULL, *timeout = NULL;
    if (nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "acquire() takes at most 2 arguments (blocking, timeout)");
        return NULL;
    }
    if (nargs > 0)
        blocking = args[0];
    if (nargs > 1)
        timeout = args[1];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i);
        PyObject **slot = PyUnicode_CompareWithASCIIString(key, "blocking") == 0 ? &blocking
                          : PyUnicode_CompareWithASCIIString(key, "timeout") == 0 ? &timeout : NULL;
        if (slot == NULL || *slot != NULL) {
            PyErr_Format(PyExc_TypeError, slot == NULL ? "acquire() got an unexpected keyword argument '%U'"
                                                       : "acquire() got multiple values for argument '%U'", key);
            return NULL;
        }
        *slot = args[nargs + i];
    }
    int block = blocking != NULL ? PyObject_IsTrue(blocking) : 1;
    if (block < 0)
        return NULL;
    double seconds = timeout != NULL ? PyFloat_AsDouble(timeout) : -1.0;
    if (seconds == -1.0 && PyErr_Occurred())
        return NULL;
    if (Py_IS_NAN(seconds)) {
        PyErr_SetString(PyExc_ValueError, "Invalid value NaN (not a number)");
        return NULL;
    }
    if (!block && seconds != -1.0) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (seconds < 0 && seconds != -1.0) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be positive");
        return NULL;
    }
    if (seconds > 9.2e12) {  /* microseconds past a long long */
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return NULL;
    }
    int r = take(self, !block ? 0 : seconds < 0 ? -1 : (long long)(seconds * 1e6));
    return r < 0 ? NULL : PyBool_FromLong(r);
}

/* release(): RuntimeError where the calling thread does not hold it, as RLock's. */
static PyObject *RecorderLock_release(RecorderLock *self, PyObject *Py_UNUSED(ignored))
{
    if (self->count == 0 || self->owner != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return NULL;
    }
    if (--self->count == 0) {
        self->owner = 0;
        PyThread_release_lock(self->lock);
    }
    Py_RETURN_NONE;
}

static PyObject *RecorderLock_exit(RecorderLock *self, PyObject *Py_UNUSED(args))
{
    return RecorderLock_release(self, NULL);
}

/* _is_owned(): whether the calling thread holds it (threading.Condition's name for it) */
static PyObject *RecorderLock_is_owned(RecorderLock *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(self->count > 0 && self->owner == PyThread_get_thread_ident());
}

static PyObject *RecorderLock_repr(RecorderLock *self)
{
    return PyUnicode_FromFormat("<RecorderLock %s count=%lu>", self->count ? "locked" : "unlocked", self->count);
}

static PyMethodDef RecorderLock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))RecorderLock_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1): take the lock (threading.RLock's arguments); whether it was taken."},
    {"release", (PyCFunction)RecorderLock_release, METH_NOARGS, "Give the lock back once."},
    {"__enter__", (PyCFunction)(void (*)(void))RecorderLock_acquire, METH_FASTCALL | METH_KEYWORDS, "acquire()"},
    {"__exit__", (PyCFunction)RecorderLock_exit, METH_VARARGS, "release()"},
    {"_is_owned", (PyCFunction)RecorderLock_is_owned, METH_NOARGS, "Whether this thread holds the lock."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RecorderLockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_nb.capture._recorder_lock.RecorderLock",
    .tp_basicsize = sizeof(RecorderLock),
    .tp_dealloc = (destructor)RecorderLock_dealloc,
    .tp_repr = (reprfunc)RecorderLock_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The recorder's reentrant lock: threading.RLock's behaviour; acquire() parses nothing when given none.",
    .tp_methods = RecorderLock_methods,
    .tp_new = RecorderLock_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recorder_lock", "The recorder's reentrant lock.", -1, NULL,
};

PyMODINIT_FUNC PyInit__recorder_lock(void)
{
    if (PyType_Ready(&RecorderLockType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RecorderLockType);
    if (PyModule_AddObject(m, "RecorderLock", (PyObject *)&RecorderLockType) < 0) {
        Py_DECREF(&RecorderLockType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "ABI", RECORDER_LOCK_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
