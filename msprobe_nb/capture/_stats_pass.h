/* The one-pass statistics kernel of float32 memory, shared by the C extensions that summarise tensors
 * (_fused_stats.c for stats.py, _row_builder.c for the recorder's rows): max, min, sum and sum of squares.
 * Semantics: see _fused_stats.c. Included, not linked: each extension is built on its own by setup.py.
 */
#ifndef MSPROBE_NB_STATS_PASS_H
#define MSPROBE_NB_STATS_PASS_H

#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float v8f __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));

/* lane by lane a > m ? a : m (a NaN lane keeps m: NaNs are tracked on their own) */
#define VMAX(a, m) ((v8f)(((v8i)(a) & ((a) > (m))) | ((v8i)(m) & ~((a) > (m)))))
#define VMIN(a, m) ((v8f)(((v8i)(a) & ((a) < (m))) | ((v8i)(m) & ~((a) < (m)))))

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif

/* The ABI of the statistics extensions (_fused_stats, _row_builder), exported as their ABI attribute: raise it
   whenever a function's arguments, a result's layout or the context's fields change, with the number the
   Python side expects (capture/c_contract.py), so that a stale build is refused instead of misread. */
#define MSPROBE_NB_STATS_ABI 3

/* a summary's row in the summarizer's flat buffer (the C rows write it, pack_stats reads it): max, min, mean, norm
   and the NaN, +inf and -inf counts, as doubles */
#define STATS_ROW_BYTES (7 * (Py_ssize_t)sizeof(double))

/* torch's float32 norm from a sum of squares: |x| for one element (first), inf once the float32 sum of squares
   overflows, else its square root. The one definition of the rule, for every extension that computes norms. */
static inline double f32_norm(double sum_sq, Py_ssize_t n, double first)
{
    return n == 1 ? fabs(first) : sum_sq > FLT_MAX ? (double)INFINITY : sqrt(sum_sq);
}

#define BLOCK 32   /* floats per inner iteration: four vectors, four independent chains */
#define FOLD 512   /* floats per float-lane partial sum before it is added to the double totals */

/* out: max, min, sum, sum of squares (sums in double); returns 1 when some element is NaN */
MULTIVERSION static int stats_pass(const float *x, Py_ssize_t n, double out[4])
{
    v8f zero = {0};
    v8f mx0 = zero - INFINITY, mx1 = mx0, mx2 = mx0, mx3 = mx0;
    v8f mn0 = zero + INFINITY, mn1 = mn0, mn2 = mn0, mn3 = mn0;
    v8i nan = {0};
    double s = 0.0, q = 0.0;
    float fmx = -INFINITY, fmn = INFINITY;
    int any_nan = 0;
    Py_ssize_t i = 0;
    Py_ssize_t whole = n - n % BLOCK;
    while (i < whole) {
        v8f s0 = zero, s1 = zero, s2 = zero, s3 = zero, q0 = zero, q1 = zero, q2 = zero, q3 = zero;
        Py_ssize_t end = i + FOLD < whole ? i + FOLD : whole;
        for (; i < end; i += BLOCK) {
            v8f a, b, c, d;
            memcpy(&a, x + i, sizeof a);
            memcpy(&b, x + i + 8, sizeof b);
            memcpy(&c, x + i + 16, sizeof c);
            memcpy(&d, x + i + 24, sizeof d);
            mx0 = VMAX(a, mx0); mx1 = VMAX(b, mx1); mx2 = VMAX(c, mx2); mx3 = VMAX(d, mx3);
            mn0 = VMIN(a, mn0); mn1 = VMIN(b, mn1); mn2 = VMIN(c, mn2); mn3 = VMIN(d, mn3);
            s0 += a; s1 += b; s2 += c; s3 += d;
            q0 += a * a; q1 += b * b; q2 += c * c; q3 += d * d;
            nan |= (a != a) | (b != b) | (c != c) | (d != d);
        }
        v8f st = (s0 + s1) + (s2 + s3), qt = (q0 + q1) + (q2 + q3);
        for (int k = 0; k < 8; k++) {
            s += st[k];
            q += qt[k];
        }
    }
    v8f mx = VMAX(VMAX(mx0, mx1), VMAX(mx2, mx3));
    v8f mn = VMIN(VMIN(mn0, mn1), VMIN(mn2, mn3));
    for (int k = 0; k < 8; k++) {
        if (mx[k] > fmx) fmx = mx[k];
        if (mn[k] < fmn) fmn = mn[k];
        if (nan[k]) any_nan = 1;
    }
    for (; i < n; i++) {
        float v = x[i];
        if (v > fmx) fmx = v;
        if (v < fmn) fmn = v;
        if (v != v) any_nan = 1;
        s += v;
        q += (double)v * v;
    }
    out[0] = fmx;
    out[1] = fmn;
    out[2] = s;
    out[3] = q;
    return any_nan;
}

/* The most dimensions the strided passes read (torch allows more; a view with more goes to torch's reductions). */
#define STRIDED_MAX_DIMS 25

/* A view's layout as few (size, stride) dimensions as read the same elements: size-1 dimensions dropped, the
   others ordered by stride, smallest first, and merged where one steps exactly over the next, so a permutation
   of a dense block is one dimension and a slice one per row. Returns their number (at least 1), or -1 for a
   layout the passes do not read (a negative stride, an empty dimension, more than STRIDED_MAX_DIMS). */
static int merged_layout(int ndim, const Py_ssize_t *size, const Py_ssize_t *stride, Py_ssize_t *sz,
                         Py_ssize_t *st)
{
    int d = 0;
    if (ndim > STRIDED_MAX_DIMS)
        return -1;
    for (int k = 0; k < ndim; k++) {
        if (size[k] <= 0 || stride[k] < 0)
            return -1;
        if (size[k] == 1)
            continue;
        int j = d++;  /* insertion by stride, smallest first */
        while (j > 0 && st[j - 1] > stride[k]) {
            sz[j] = sz[j - 1];
            st[j] = st[j - 1];
            j--;
        }
        sz[j] = size[k];
        st[j] = stride[k];
    }
    int m = 0;
    for (int k = 0; k < d; k++) {
        if (m > 0 && st[m - 1] > 0 && st[k] == st[m - 1] * sz[m - 1]) {
            sz[m - 1] *= sz[k];
            continue;
        }
        sz[m] = sz[k];
        st[m] = st[k];
        m++;
    }
    if (m == 0) {  /* one element */
        sz[0] = 1;
        st[0] = 1;
        m = 1;
    }
    return m;
}

/* The first element of the next run of a merged layout (dimensions past the first), or NULL after the last:
   an odometer over idx, the second dimension fastest. */
static inline const float *next_run(const float *x, int m, const Py_ssize_t *sz, const Py_ssize_t *st,
                                    Py_ssize_t *idx)
{
    int k = 1;
    for (; k < m; k++) {
        if (++idx[k] < sz[k])
            break;
        idx[k] = 0;
    }
    if (k == m)
        return NULL;
    const float *p = x;
    for (k = 1; k < m; k++)
        p += idx[k] * st[k];
    return p;
}

/* stats_pass over a strided float32 view (a transpose, a slice, a permuted or expanded tensor): x its first
   element, size and stride per dimension in elements, as tensor.shape and tensor.stride() give them. The same
   numbers as stats_pass on a contiguous copy up to summation order: a repeated (stride 0) element counts as
   often as the view shows it. stats_pass runs on each contiguous run of the merged layout, a scalar loop
   where the innermost stride is not 1. Returns 1 when some element is NaN, 0 otherwise, -1 for a layout it
   does not read (merged_layout). */
MULTIVERSION static int strided_pass(const float *x, int ndim, const Py_ssize_t *size, const Py_ssize_t *stride,
                                     double out[4])
{
    Py_ssize_t sz[STRIDED_MAX_DIMS], st[STRIDED_MAX_DIMS], idx[STRIDED_MAX_DIMS] = {0};
    int m = merged_layout(ndim, size, stride, sz, st);
    if (m < 0)
        return -1;
    double mx = -INFINITY, mn = INFINITY, s = 0.0, q = 0.0, part[4];
    int any_nan = 0;
    const Py_ssize_t inner = sz[0], step = st[0];
    for (const float *p = x; p != NULL; p = next_run(x, m, sz, st, idx)) {
        if (step == 1) {
            any_nan |= stats_pass(p, inner, part);
        } else {
            float fmx = -INFINITY, fmn = INFINITY;
            double ps = 0.0, pq = 0.0;
            for (Py_ssize_t i = 0; i < inner; i++) {
                float v = p[i * step];
                if (v > fmx) fmx = v;
                if (v < fmn) fmn = v;
                if (v != v) any_nan = 1;
                ps += v;
                pq += (double)v * v;
            }
            part[0] = fmx;
            part[1] = fmn;
            part[2] = ps;
            part[3] = pq;
        }
        if (part[0] > mx) mx = part[0];
        if (part[1] < mn) mn = part[1];
        s += part[2];
        q += part[3];
    }
    out[0] = mx;
    out[1] = mn;
    out[2] = s;
    out[3] = q;
    return any_nan;
}

/* The statistics of a float32 view holding NaN or inf, by torch's rules, and their counts: out = max, min, sum,
   norm (float32-rounded as the kernel's result gives them), then the NaN, +inf and -inf counts. A NaN makes
   max, min, sum and norm NaN; else +inf is the max and -inf the min, the sum is +inf, -inf, or NaN with both,
   and the norm inf. Only for the rare tensor stats_pass found not finite (a mask, an overflow): one scalar
   loop. Returns 0, or -1 for a layout it does not read (merged_layout). */
static inline int counted_pass(const float *x, int ndim, const Py_ssize_t *size, const Py_ssize_t *stride,
                               double out[7])
{
    Py_ssize_t sz[STRIDED_MAX_DIMS], st[STRIDED_MAX_DIMS], idx[STRIDED_MAX_DIMS] = {0};
    int m = merged_layout(ndim, size, stride, sz, st);
    if (m < 0)
        return -1;
    float fmx = -INFINITY, fmn = INFINITY, first = NAN;
    double s = 0.0, q = 0.0;
    Py_ssize_t nan = 0, pinf = 0, ninf = 0, n = 0;
    const Py_ssize_t inner = sz[0], step = st[0];
    for (const float *p = x; p != NULL; p = next_run(x, m, sz, st, idx)) {
        for (Py_ssize_t i = 0; i < inner; i++) {
            float v = p[i * step];
            if (n++ == 0)
                first = v;
            if (v != v) {
                nan++;
            } else if (isinf(v)) {
                if (v > 0) pinf++; else ninf++;
            } else {
                if (v > fmx) fmx = v;
                if (v < fmn) fmn = v;
                s += v;
                q += (double)v * v;
            }
        }
    }
    double sum = (double)(float)s;
    if (nan) {
        out[0] = out[1] = out[2] = out[3] = NAN;
    } else {
        out[0] = pinf ? (double)INFINITY : (double)fmx;
        out[1] = ninf ? -(double)INFINITY : (double)fmn;
        out[2] = pinf && ninf ? (double)NAN : pinf ? (double)INFINITY : ninf ? -(double)INFINITY : sum;
        out[3] = pinf || ninf ? (double)INFINITY : (double)(float)f32_norm(q, n, (double)first);
    }
    out[4] = (double)nan;
    out[5] = (double)pinf;
    out[6] = (double)ninf;
    return 0;
}

/* A view's shape and strides from Python sequences (tuples, torch.Size) of as many ints into size and stride,
   its dimensions into *ndim and its element count into *n. Returns 0; -1 for a layout the passes do not read
   (more than STRIDED_MAX_DIMS dimensions, no elements); -2 with a Python error set when they are not such
   ints. */
static int parse_layout(PyObject *shape, PyObject *strides, Py_ssize_t *size, Py_ssize_t *stride, int *ndim,
                        Py_ssize_t *n)
{
    PyObject *a = PySequence_Fast(shape, "the shape must be a sequence of ints");
    if (a == NULL)
        return -2;
    PyObject *b = PySequence_Fast(strides, "the strides must be a sequence of ints");
    if (b == NULL) {
        Py_DECREF(a);
        return -2;
    }
    Py_ssize_t d = PySequence_Fast_GET_SIZE(a);
    int got = -1;
    if (d != PySequence_Fast_GET_SIZE(b)) {
        PyErr_SetString(PyExc_ValueError, "a shape and strides of different lengths");
        got = -2;
    } else if (d <= STRIDED_MAX_DIMS) {
        *n = 1;
        *ndim = (int)d;
        got = 0;
        for (Py_ssize_t k = 0; k < d; k++) {
            size[k] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(a, k));
            stride[k] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(b, k));
            if ((size[k] == -1 || stride[k] == -1) && PyErr_Occurred()) {
                got = -2;
                break;
            }
            *n *= size[k];
        }
        if (got == 0 && *n <= 0)
            got = -1;
    }
    Py_DECREF(a);
    Py_DECREF(b);
    return got;
}

/* strided_pass from Python sequences (parse_layout), with the element count in *n: returns as strided_pass,
   or -2 with a Python error set. */
static int strided_pass_seq(const float *x, PyObject *shape, PyObject *strides, Py_ssize_t *n, double out[4])
{
    Py_ssize_t size[STRIDED_MAX_DIMS], stride[STRIDED_MAX_DIMS];
    int ndim = 0;
    int got = parse_layout(shape, strides, size, stride, &ndim, n);
    if (got != 0)
        return got;
    if (*n >= (1 << 18)) {
        Py_BEGIN_ALLOW_THREADS
        got = strided_pass(x, ndim, size, stride, out);
        Py_END_ALLOW_THREADS
    } else {
        got = strided_pass(x, ndim, size, stride, out);
    }
    return got;
}

/* float16 and bfloat16 values widened to float32, exactly as torch's .to(torch.float32) widens them: a
   bfloat16 is the high half of a float32; a float16's exponent is rebased (bias 15 to 127), a subnormal one
   is its mantissa times 2^-24 (exact in float32), inf and NaN stay inf and NaN. */
static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        float f = (float)man * 5.9604644775390625e-8f;  /* 2^-24 */
        return sign ? -f : f;
    }
    u = exp == 0x1f ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112u) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* n float16 (bf16 == 0) or bfloat16 (bf16 == 1) values at x, widened into dst (n float32). */
static inline void widen_half(const uint16_t *x, Py_ssize_t n, int bf16, float *dst)
{
    if (bf16)
        for (Py_ssize_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32(x[i]);
    else
        for (Py_ssize_t i = 0; i < n; i++)
            dst[i] = f16_to_f32(x[i]);
}

/* Integer and bool tensors: torch's path takes aminmax, a float64 copy, its mean and its norm, each a dispatch
   and a read back. Here: exact max and min, and the sum and sum of squares accumulated in double (four
   partial sums), as torch's float64 reductions accumulate them. For bool, the count of true elements. */
#define INT_PASS(NAME, T)                                                            \
    static inline void NAME(const T *x, Py_ssize_t n, double out[4])                        \
    {                                                                                \
        T mx = x[0], mn = x[0];                                                      \
        double s[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0};                             \
        Py_ssize_t i = 0;                                                            \
        for (; i + 4 <= n; i += 4) {                                                 \
            for (int j = 0; j < 4; j++) {                                            \
                T v = x[i + j];                                                      \
                mx = v > mx ? v : mx;                                                \
                mn = v < mn ? v : mn;                                                \
                double d = (double)v;                                                \
                s[j] += d;                                                           \
                q[j] += d * d;                                                       \
            }                                                                        \
        }                                                                            \
        for (; i < n; i++) {                                                         \
            T v = x[i];                                                              \
            mx = v > mx ? v : mx;                                                    \
            mn = v < mn ? v : mn;                                                    \
            double d = (double)v;                                                    \
            s[0] += d;                                                               \
            q[0] += d * d;                                                           \
        }                                                                            \
        out[0] = (double)mx;                                                         \
        out[1] = (double)mn;                                                         \
        out[2] = (s[0] + s[1]) + (s[2] + s[3]);                                      \
        out[3] = (q[0] + q[1]) + (q[2] + q[3]);                                      \
    }

INT_PASS(pass_i64, int64_t)
INT_PASS(pass_i32, int32_t)
INT_PASS(pass_i16, int16_t)
INT_PASS(pass_i8, int8_t)
INT_PASS(pass_u8, uint8_t)


/* int_pass(x, n, code, out): code 0..4 = int64, int32, int16, int8, uint8 -> (max, min, sum, sum of squares);
   code 5 = bool -> (count of true, 0, 0, 0). */
static inline void int_pass(const void *x, Py_ssize_t n, int code, double out[4])
{
    switch (code) {
    case 0: pass_i64((const int64_t *)x, n, out); break;
    case 1: pass_i32((const int32_t *)x, n, out); break;
    case 2: pass_i16((const int16_t *)x, n, out); break;
    case 3: pass_i8((const int8_t *)x, n, out); break;
    case 4: pass_u8((const uint8_t *)x, n, out); break;
    default: {
        const uint8_t *b = (const uint8_t *)x;
        Py_ssize_t count = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            count += b[i] != 0;
        out[0] = (double)count;
        out[1] = out[2] = out[3] = 0;
    }
    }
}

#endif
