/* The one-pass statistics kernel of float32 memory, shared by the C extensions that summarise tensors
 * (_fused_stats.c for stats.py, _row_builder.c for the recorder's rows): max, min, sum and sum of squares.
 * Semantics: see _fused_stats.c. Included, not linked: each extension is built on its own by setup.py.
 */
#ifndef MSPROBE_NB_STATS_PASS_H
#define MSPROBE_NB_STATS_PASS_H

#include <Python.h>
#include <float.h>
#include <math.h>
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
#define MSPROBE_NB_STATS_ABI 1

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

#endif
