"""Planted faults in the C of the L1 handler, the API backward, the module hooks, the strided statistics, the
recorder's lock and the writer's chunk codec (issue 37): each one-line change is built into a copy of the
repository and the tests that judge it run; a fault the tests do not fail is a gap, or is listed in
``EQUIVALENT`` with why it cannot be seen.

    python tools/c_mutants.py [--only NAME ...] [--keep]

It copies the tree (without its virtual environments and build outputs) to a temporary folder, so the working
tree and its built extensions are never touched; each fault costs one rebuild of what changed (setup.py
build_ext) and one run of the tests below (about 10-20 s here).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_api_handler.py", "tests/test_api_backward.py", "tests/test_capture.py",
         "tests/test_module_hooks_c.py", "tests/test_row_builder.py", "tests/test_slot_attrs.py",
         "tests/test_hdf5_chunk_codec.py", "tests/test_recorder_lock.py", "tests/test_recording_threads.py",
         "tests/test_nullable_ints.py"]

#: (file under msprobe_nb/capture/, or a path under msprobe_nb/ with its folder; name, original text (exactly once
#: in the file), the fault)
MUTANTS: list[tuple[str, str, str, str]] = [
    ('_api_handler.c', 'counter',
     'PyObject *next = PyNumber_Add(counter, k_one);',
     'PyObject *next = Py_NewRef(counter);'),
    ('_api_handler.c', 'parent',
     '        parent = call != NULL ? SLOT_GET(call, call) : NULL;',
     '        parent = call != NULL ? Py_NewRef(s_empty) : NULL;'),
    ('_api_handler.c', 'direction',
     'direction = Py_NewRef(inside ? s_recompute : s_forward);',
     'direction = Py_NewRef(s_forward);'),
    ('_api_handler.c', 'operator',
     'out = same ? PyTuple_Pack(2, s_tensor_family, dunder) : Py_NewRef(resolved);',
     'out = Py_NewRef(resolved);'),
    ('_api_handler.c', 'backward-skip',
     '    return fn != Py_None;\n}',
     '    return 0;\n}'),
    ('_api_handler.c', 'positions',
     '*path = PyTuple_GET_ITEM(positions, i);',
     '*path = PyTuple_GET_ITEM(positions, 0);'),
    ('_api_handler.c', 'mark-written',
     'PyObject_RichCompareBool(now, version, Py_NE)',
     'PyObject_RichCompareBool(now, version, Py_EQ)'),
    ('_api_handler.c', 'share',
     '    if (same && PyTuple_GET_SIZE(args)) {',
     '    if (0 && same && PyTuple_GET_SIZE(args)) {'),
    ('_api_handler.c', 'construct',
     'orphan ? Py_None : parent',
     'parent'),
    ('_api_handler.c', 'consumed',
     'r = custom > 0 ? call2(CTX(h, C_CONSUMED), node, PyTuple_GET_ITEM(key, 3)) : NULL;',
     'r = custom > 0 ? Py_NewRef(Py_None) : NULL;'),
    ('_api_handler.c', 'draw-policy',
     '        out = record(h, func, named, frame, args, kwargs, policy);',
     '        out = record(h, func, named, frame, args, kwargs, NULL);'),
    ('_api_handler.c', 'draw-args',
     '        args = PyTuple_GET_ITEM(drawn, 1);',
     '        (void)0;'),
    ('_api_handler.c', 'draw-kwargs',
     '        kwargs = PyTuple_GET_ITEM(drawn, 2);',
     '        (void)0;'),
    ('_api_handler.c', 'draw-run',
     '    out = call_func(drawn != NULL ? PyTuple_GET_ITEM(drawn, 0) : func, args, kwargs);',
     '    out = call_func(func, args, kwargs);'),
    ('_api_handler.c', 'stack-frame',
     'sid = call1(CTX(h, C_STACK_ID), frame != NULL ? (PyObject *)frame : Py_None);',
     'sid = call1(CTX(h, C_STACK_ID), Py_None);'),
    ('_api_handler.c', 'custom-forward',
     'int fwd = PyUnicode_Compare(code->co_name, s_forward) == 0;',
     'int fwd = 0;'),
    ('_api_handler.c', 'replaying',
     '    int slow = truth(PyObject_GetAttr(mode, s_replaying));',
     '    int slow = 0;'),
    ('_api_calls.h', 'index',
     'PyObject *after = idx != NULL ? PyNumber_Add(idx, k_one) : NULL;',
     'PyObject *after = idx != NULL ? Py_NewRef(idx) : NULL;'),
    ('_api_handler.c', 'kwargs-rows',
     '            if (any < 0 || (any && add_rows(h, c, name, 0, kwargs, 1) < 0))',
     '            if (any < 0)'),
    ('_api_backward.c', 'seq-ge',
     'int r = PyObject_RichCompareBool(sn, seq0, Py_GE);',
     'int r = PyObject_RichCompareBool(sn, seq0, Py_GT);'),
    ('_api_backward.c', 'edge-acc',
     '        PyObject *key = id != NULL ? PyTuple_Pack(2, id, k_minus_one) : NULL;',
     '        PyObject *key = id != NULL ? PyTuple_Pack(2, id, k_zero) : NULL;'),
    ('_api_backward.c', 'counts',
     '                if (!failed)\n                    counts[j] += 1;',
     '                if (!failed)\n                    counts[j] += 2;'),
    ('_api_backward.c', 'max-nodes',
     'if (!failed && PySet_GET_SIZE(seen) > max_nodes)',
     'if (!failed && PySet_GET_SIZE(seen) > 1)'),
    ('_api_backward.c', 'no-walk-skip-acc',
     '            if ((PyObject *)Py_TYPE(nxt) == CTX(ctx, C_ACCUMULATE_GRAD))\n                continue;',
     ''),
    ('_api_backward.c', 'emit-direct',
     '            } else if (r->pending[j] == 0 && !held) {',
     '            } else if (0) {'),
    ('_api_backward.c', 'acc-sum',
     '                    sum = PyNumber_Add(prev, g);',
     '                    sum = Py_NewRef(g);'),
    ('_api_backward.c', 'reset',
     '    if (r->left <= 0) /* every node',
     '    if (0) /* every node'),
    ('_api_backward.c', 'bwd-share',
     '    if (r->share && outs != NULL && PyTuple_GET_SIZE(outs) == 1) {',
     '    if (0) {'),
    ('_api_backward.c', 'open-index',
     'r->stack_id,\n                        idx};',
     'r->stack_id,\n                        k_zero};'),
    ('_api_backward.c', 'bwd-construct',
     '    if (has_parent > 0) {',
     '    if (0) {'),
    ('_api_backward.c', 'out-rows',
     '        int failed = g == NULL || rows_of(r, 0, g, PyTuple_GET_ITEM(pair, 0)) < 0;',
     '        int failed = g == NULL;'),
    ('_api_backward.c', 'paths',
     '    return rows_of(r, 1, g, PyTuple_GET_ITEM(r->paths, j));',
     '    return rows_of(r, 1, g, PyTuple_GET_ITEM(r->paths, 0));'),
    ('_api_backward.c', 'nodes-edges',
     '        if (known < 0 || (!known && PyList_Append(nodes, key) < 0))',
     '        if (known < 0)'),
    ('_api_backward.c', 'wanted-first',
     '        int failed = had < 0 || (!had && PyDict_SetItem(wanted, k2, jj) < 0);',
     '        int failed = had < 0 || PyDict_SetItem(wanted, k2, jj) < 0;'),
    ('_api_backward.c', 'active',
     '    if (on <= 0)\n        return on < 0 ? NULL : Py_NewRef(Py_None);',
     '    if (on < 0)\n        return NULL;'),
    ('_api_calls.h', 'no-tf-off',
     '    PyObject *entered = *off != NULL ? PyObject_CallMethodNoArgs(*off, s_enter) : NULL;',
     '    PyObject *entered = *off != NULL ? Py_NewRef(Py_None) : NULL;'),
    ('_api_calls.h', 'fresh',
     'PyList_GET_ITEM(calls, ks) != c;',
     'PyList_GET_ITEM(calls, ks) == c;'),
    ('_api_calls.h', 'is_kwarg',
     '    PyObject *argv[] = {rows, value, prefix, k, base, io_code, is_kwarg ? Py_True : Py_False,',
     '    PyObject *argv[] = {rows, value, prefix, k, base, io_code, Py_False,'),
    ('_api_calls.h', 'prefix',
     '    PyObject *argv[] = {rows, value, prefix, k, base,',
     '    PyObject *argv[] = {rows, value, s_empty, k, base,'),
    ('_api_calls.h', 'busy',
     '    if (add_to(rec, s_busy, &sc_busy, 1) < 0) {',
     '    if (add_to(rec, s_busy, &sc_busy, 0) < 0) {'),
    ('_api_calls.h', 'fallback-kw',
     '        PyObject *kwnames = PyTuple_Pack(3, s_prefix, s_is_kwarg, s_set_producer);',
     '        PyObject *kwnames = PyTuple_Pack(3, s_prefix, s_set_producer, s_is_kwarg);'),
    ('_api_backward.c', 'bwd-names-tail',
     'PyUnicode_Substring(call, 0, PyUnicode_GET_LENGTH(call) - 7)',
     'PyUnicode_Substring(call, 0, PyUnicode_GET_LENGTH(call) - 8)'),
    ('_api_backward.c', 'bwd-names-parent',
     '    if (has > 0)\n        *parent = cached(',
     '    if (0)\n        *parent = cached('),
    ('_module_hooks.c', 'mh-counter',
     '    next = PyNumber_Add(counter, k_one);',
     '    next = Py_NewRef(counter);'),
    ('_module_hooks.c', 'mh-parent',
     '    return SLOT_GET(PyTuple_GET_ITEM(top, 1), call);',
     '    return Py_NewRef(s_empty);'),
    ('_module_hooks.c', 'mh-direction',
     'task != -1 ? s_recompute : s_forward',
     's_forward'),
    ('_module_hooks.c', 'mh-construct',
     'PyUnicode_GET_LENGTH(parent) ? parent : Py_None',
     'parent'),
    ('_module_hooks.c', 'mh-kwargs',
     'if (has_kwargs && add_rows_c(',
     'if (0 && has_kwargs && add_rows_c('),
    ('_module_hooks.c', 'mh-params',
     'if (PyDict_GET_SIZE(params)',
     'if (0 && PyDict_GET_SIZE(params)'),
    ('_module_hooks.c', 'mh-producer',
     'CTX(h, C_IO_OUTPUT), outs, s_empty, 0,\n                       1)',
     'CTX(h, C_IO_OUTPUT), outs, s_empty, 0,\n                       0)'),
    ('_module_hooks.c', 'mh-grad-skip',
     'if (idx < 0 && is_output)',
     'if (0 && is_output)'),
    ('_module_hooks.c', 'mh-grad-io',
     'CTX(h, is_output ? C_IO_OUTPUT : C_IO_INPUT)',
     'CTX(h, C_IO_INPUT)'),
    ('_module_hooks.c', 'mh-sides',
     '{{s_input, o}, {s_output, in}}',
     '{{s_output, o}, {s_input, in}}'),
    ('_module_hooks.c', 'mh-pop',
     'PyList_SetSlice(stack, i, PyList_GET_SIZE(stack), NULL)',
     'PyList_SetSlice(stack, i + 1, PyList_GET_SIZE(stack), NULL)'),
    ('_module_hooks.c', 'mh-root',
     ' || PyUnicode_GET_LENGTH(path) == 0) {',
     ') {'),
    ('_module_hooks.c', 'mh-dump',
     'SLOT_SET(c, dump, dump ? Py_True : Py_False) < 0)\n        goto fail;',
     'SLOT_SET(c, dump, Py_True) < 0)\n        goto fail;'),
    ('_module_hooks.c', 'mh-grad-index',
     'int bad = taken == NULL || SLOT_SET(b, index, taken) < 0;',
     'int bad = taken == NULL;'),
    ('_module_hooks.c', 'mh-stack-frame',
     'PyObject *sid = call1(CTX(h, C_WALKED_ID), frame);',
     'PyObject *sid = call1(CTX(h, C_WALKED_ID), Py_None);'),
    ('_module_hooks.c', 'mh-grad-enabled',
     'int on = truth(PyObject_CallNoArgs(CTX(h, C_GRAD_ENABLED)));',
     'int on = 1;'),
    ('_module_hooks.c', 'mh-param-counter',
     '    next = PyNumber_Add(k, k_one);',
     '    next = Py_NewRef(k);'),
    ('_module_hooks.c', 'mh-param-base',
     'c, name, name, s_parameters_grad',
     'c, name, ph->key, s_parameters_grad'),
    ('_module_hooks.c', 'mh-param-watch',
     'int watch = PyObject_IsTrue(CTX(h, C_RECORDS_MODULES));',
     'int watch = 0;'),
    ('_module_hooks.c', 'mh-param-selected',
     'int dump = truth(PyObject_Vectorcall(CTX(h, C_SELECTED), sargv, 3, NULL));',
     'int dump = 1;'),
    ('_module_hooks.c', 'mh-param-shared-index',
     '    if (index != NULL)\n        Py_INCREF(index);\n    else if',
     '    if (0)\n        Py_INCREF(index);\n    else if'),
    # the strided statistics kernel (_stats_pass.h) and the row builder's use of it
    ('_stats_pass.h', 'strided-merge',
     'if (m > 0 && st[m - 1] > 0 && st[k] == st[m - 1] * sz[m - 1]) {',
     'if (m > 0 && st[m - 1] > 0) {'),
    ('_stats_pass.h', 'strided-order',
     'while (j > 0 && st[j - 1] > stride[k]) {',
     'while (0) {'),
    ('_stats_pass.h', 'strided-odometer',
     '        if (++idx[k] < sz[k])',
     '        if (++idx[k] < sz[k] - 1)'),
    ('_stats_pass.h', 'counted-sign',
     'if (v > 0) pinf++; else ninf++;',
     'if (v > 0) ninf++; else pinf++;'),
    ('_stats_pass.h', 'counted-both-infinities',
     'out[2] = pinf && ninf ? (double)NAN : pinf',
     'out[2] = pinf'),
    ('_stats_pass.h', 'counted-nan',
     '    if (nan) {\n        out[0] = out[1] = out[2] = out[3] = NAN;',
     '    if (0) {\n        out[0] = out[1] = out[2] = out[3] = NAN;'),
    ('_stats_pass.h', 'strided-step',
     '                float v = p[i * step];',
     '                float v = p[i];'),
    ('_stats_pass.h', 'half-subnormal',
     'float f = (float)man * 5.9604644775390625e-8f;  /* 2^-24 */',
     'float f = (float)man * 1.1920928955078125e-7f;'),
    ('_stats_pass.h', 'half-exponent',
     'sign | ((exp + 112u) << 23) | (man << 13)',
     'sign | ((exp + 111u) << 23) | (man << 13)'),
    ('_stats_pass.h', 'half-bf16',
     'uint32_t u = (uint32_t)h << 16;',
     'uint32_t u = (uint32_t)h << 15;'),
    ('_row_builder.c', 'rb-half-max',
     '        if (n > most)\n            return 0;',
     '        if (0)\n            return 0;'),
    ('_row_builder.c', 'rb-half-contiguous',
     'if (!contiguous && (kind != READ_F32 || copying))',
     'if (!contiguous && copying)'),
    ('_row_builder.c', 'rb-int-bool',
     '            row[1] = out[0] == (double)n;',
     '            row[1] = out[0] > 0;'),
    ('_row_builder.c', 'rb-int-code',
     '            return (int)j;',
     '            return 0;'),
    ('_row_builder.c', 'rb-int-mean',
     '            row[2] = out[2] / (double)n;',
     '            row[2] = out[2] / (double)(n + 1);'),
    ('_row_builder.c', 'rb-strided-finite',
     '    if (any_nan || !isfinite(out[0]) || !isfinite(out[1]))\n        return 0;',
     '    if (0)\n        return 0;'),
    ('_row_builder.c', 'rb-attr-names',
     '            attr_caches[j].type = NULL; /* filled again for this name */',
     '            (void)0;'),
    ('_row_builder.c', 'rb-attr-column',
     '            PyList_SET_ITEM(PyList_GET_ITEM(out, j), i, v);',
     '            PyList_SET_ITEM(PyList_GET_ITEM(out, k - 1 - j), i, v);'),
    ('_slot_attrs.h', 'slot-stale-tag',
     'PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) && e->tag == tp->tp_version_tag)',
     'PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG))'),
    ('_slot_attrs.h', 'descr-stale-tag',
     '            if (c->e[i].type == tp && c->e[i].tag == tp->tp_version_tag)',
     '            if (c->e[i].type == tp)'),
    ('_slot_attrs.h', 'descr-other-type',
     '            if (c->e[i].type == tp && c->e[i].tag == tp->tp_version_tag)',
     '            if (c->e[i].tag == tp->tp_version_tag || c->e[i].type == tp)'),
    ('_slot_attrs.h', 'method-shadow-ignored',
     '        int shadowed = PyDict_Contains(*dict, name);',
     '        int shadowed = 0;'),
    ('_slot_attrs.h', 'slot-set-lost',
     '    *addr = Py_NewRef(value);\n    Py_XDECREF(old);',
     '    (void)addr;\n    (void)old;'),
    ('_api_handler.c', 'grad-inputs-listed-path',
     '            failed = sub == NULL || grad_input(out, sub, item, tensor) < 0;',
     '            failed = sub == NULL || grad_input(out, path, item, tensor) < 0;'),
    ('_api_handler.c', 'grad-inputs-keyword-path',
     'failed = grad_inputs_of(&out, key, a, tensor) < 0;',
     'failed = grad_inputs_of(&out, PyTuple_GET_ITEM(positions, 0), a, tensor) < 0;'),
    ('_api_handler.c', 'grad-inputs-deeper',
     '        if (!exact || nested(item))',
     '        if (nested(item))'),
    ('_api_handler.c', 'direct-frame-back',
     'direct ? (PyFrameObject *)Py_NewRef(here) : PyFrame_GetBack(here);',
     'PyFrame_GetBack(here);'),
    ('_api_handler.c', 'direct-compiling-ignored',
     '    int compiling = flag == NULL ? (PyErr_Occurred() ? -1 : 0) : flag == Py_False ? 0 : PyObject_IsTrue(flag);',
     '    int compiling = flag == NULL ? (PyErr_Occurred() ? -1 : 0) : 0;'),
    ('_api_handler.c', 'direct-other-function',
     '        || PyMethod_GET_FUNCTION(res) != registered_handler)',
     '        )'),
    ('_api_handler.c', 'direct-other-mode',
     '           && CTX((Handler *)h, C_MODE) == mode;',
     '           && 1;'),
    ('_api_handler.c', 'direct-other-self',
     '    if (res == NULL || registered_handler == NULL || !PyMethod_Check(res) || PyMethod_GET_SELF(res) != self',
     '    if (res == NULL || registered_handler == NULL || !PyMethod_Check(res)'),
    ('_api_handler.c', 'dict-getattro',
     '    if (registered_handler == NULL || t->tp_getattro != PyObject_GenericGetAttr || t->tp_dictoffset == 0',
     '    if (registered_handler == NULL || t->tp_dictoffset == 0'),
    ('_api_handler.c', 'dict-registered',
     '        || _PyType_Lookup(t, s_torch_function_name) != registered_handler)\n        return NULL;',
     '        )\n        return NULL;'),
    ('_api_handler.c', 'dict-descriptor',
     '    if (hd != NULL && Py_TYPE(hd)->tp_descr_set != NULL)',
     '    if (0 && hd != NULL)'),
    ('_api_handler.c', 'dict-own-attr',
     '    if (PyDict_CheckExact(d) && PyDict_GetItemWithError(d, s_torch_function_name) == NULL && !PyErr_Occurred())',
     '    if (PyDict_CheckExact(d))'),
    ('_row_builder.c', 'rb-tuple-leaf',
     '    int leaf = !(PyList_Check(value) || PyTuple_Check(value) || PyDict_Check(value));',
     '    int leaf = !(PyList_Check(value) || PyDict_Check(value));'),
    ('_new_call.h', 'new-call-any-init',
     '    int same = qual != NULL && PyUnicode_Check(qual) && PyUnicode_Compare(qual, want) == 0;',
     '    int same = 1;'),
    ('_new_call.h', 'new-call-first-default',
     '        PyObject *v = i < nargs ? argv[i] : PyTuple_GET_ITEM(L->defaults, i - first_default);',
     '        PyObject *v = i < nargs ? argv[i] : PyTuple_GET_ITEM(L->defaults, 0);'),
    ('_dotted_names.h', 'names-not-ascii',
     '        ascii &= PyUnicode_CheckExact(parts[j]) && PyUnicode_IS_ASCII(parts[j]);',
     '        ascii &= PyUnicode_CheckExact(parts[j]);'),
    ('_dotted_names.h', 'names-index-cache',
     '    if (i >= 0 && i < INDEX_TEXTS) {',
     '    if (i >= 0 && i < INDEX_TEXTS + 100) {'),
    ('_dotted_names.h', 'names-counter-text',
     '        else if (i >= 0 && i < INDEX_TEXTS)\n            return index_text(i);',
     '        else if (i >= 0)\n            return index_text(i % INDEX_TEXTS);'),
    ('_row_builder.c', 'rb-shape-slice',
     'PyTuple_GetSlice(size, 0, PyTuple_GET_SIZE(size))',
     'PyTuple_GetSlice(size, 1, PyTuple_GET_SIZE(size))'),
    ('_row_builder.c', 'rb-identity-new-producer',
     '        got[2] = Py_NewRef(s_empty);\n        status = 0;\n        goto done;',
     '        got[2] = Py_NewRef(call);\n        status = 0;\n        goto done;'),
    ('_row_builder.c', 'rb-identity-seen-id',
     '        got[1] = Py_NewRef(PyList_GET_ITEM(e, 3));',
     '        got[1] = Py_NewRef(PyList_GET_ITEM(e, 2));'),
    ('store/_chunk_codec.c', 'codec-checksum-order',
     'dst[total + i] = (uint8_t)(sum >> (8 * i));',
     'dst[total + i] = (uint8_t)(sum >> (8 * (3 - i)));'),
    ('store/_chunk_codec.c', 'codec-block-bytes',
     'put_be(dst + 8, (uint64_t)(block * (size_t)elem), 4);',
     'put_be(dst + 8, (uint64_t)block, 4);'),
    ('store/_chunk_codec.c', 'codec-size',
     'put_be(dst, (uint64_t)in.len, 8);',
     'put_be(dst, (uint64_t)n, 8);'),
    ('store/_chunk_codec.c', 'codec-run',
     'size_t run = words < 360 ? words : 360;',
     'size_t run = words < 720 ? words : 720;'),
    ('store/_chunk_codec.c', 'codec-odd-byte',
     'a += (uint32_t)p[0] << 8;',
     'a += p[0];'),
    ('store/_chunk_codec.c', 'codec-last-fold',
     '    a = (a & 0xffff) + (a >> 16);\n    b = (b & 0xffff) + (b >> 16);\n    return',
     '    return'),
    ('store/_nullable_ints.c', 'nullable-fraction',
     ' && (double)(int64_t)v == v) {',
     ') {'),
    ('store/_nullable_ints.c', 'nullable-bottom',
     'v >= -9223372036854775808.0',
     'v > -9223372036854775808.0'),
    ('store/_nullable_ints.c', 'nullable-na',
     '            y[i] = (int64_t)na;',
     '            y[i] = 0;'),
    ('_row_builder.c', 'rb-flat-index',
     '    memcpy(d + 7 * idx, s, (size_t)row);',
     '    memcpy(d + 7 * have, s, (size_t)row);'),
    ('_module_hooks.c', 'hooks-thread-pre',
     '    if (on > 0)\n        on = on_recording_thread(h, rec);\n',
     ''),
    ('_module_hooks.c', 'hooks-thread-post',
     '    if (mine <= 0)\n        return mine < 0 ? NULL : Py_NewRef(Py_None);\n',
     '    (void)mine;\n'),
    ('_module_hooks.c', 'hooks-thread-ident',
     '    if (want == PyThread_get_thread_ident())\n        return 1;',
     '    if (want != 0)\n        return 1;'),
    ('_module_hooks.c', 'hooks-thread-backward',
     '    return id != -1;\n}',
     '    return 0;\n}'),
    ('_recorder_lock.c', 'lock-reentry',
     '        self->count++;\n        return 1;',
     '        return 1;'),
    ('_recorder_lock.c', 'lock-owner',
     '    if (self->count > 0 && self->owner == me) {',
     '    if (self->count > 0) {'),
    ('_recorder_lock.c', 'lock-release-owner',
     '    if (self->count == 0 || self->owner != PyThread_get_thread_ident()) {',
     '    if (self->count == 0) {'),
    ('_recorder_lock.c', 'lock-give-back',
     '        self->owner = 0;\n        PyThread_release_lock(self->lock);',
     '        self->owner = 0;'),
    ('_recorder_lock.c', 'lock-signals',
     '            if (PyErr_CheckSignals() < 0)\n                return -1;',
     '            (void)0;'),
    ('_recorder_lock.c', 'lock-timeout',
     '                timeout_us -= slice;',
     '                (void)0;'),
    ('_recorder_lock.c', 'lock-nonblocking',
     '            if (timeout_us == 0)\n                return 0;',
     '            (void)0;'),
    ('_recorder_lock.c', 'lock-take',
     '    if (PyThread_acquire_lock(self->lock, NOWAIT_LOCK) != PY_LOCK_ACQUIRED) {',
     '    if (0) {'),
]

#: how long the tests of one fault may run: the whole list takes well under a minute
TIMEOUT_S = 300

#: faults no test can see, and why
EQUIVALENT = {
    "dict-getattro": "Python code cannot reach it: setting __getattribute__ or __getattr__ on the class clears its "
                     "tp_getattr with its tp_getattro, so torch's lookup no longer comes to mode_getattr",
    "strided-order": "ordering the dimensions by stride only lets them merge into longer runs; in any order the "
                     "odometer reads each element once, so the statistics differ by summation order at most",
    "direction": "the C path never runs inside autograd's backward: autograd runs nodes without the mode, and a "
                 "reentrant checkpoint's replay (the one place the mode is pushed there) goes to ApiMode._recorded",
}


def _copy(dst: Path) -> None:
    ignore = shutil.ignore_patterns(".git", ".venv*", "build", "*.egg-info", "__pycache__", "*.so", ".pytest_cache")
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)


def run(only: list[str], keep: bool) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="c-mutants-"))
    tree = tmp / "tree"
    _copy(tree)
    capture = tree / "msprobe_nb" / "capture"
    gaps = []
    try:
        for file, name, old, new in MUTANTS:
            if only and name not in only:
                continue
            path = tree / "msprobe_nb" / file if "/" in file else capture / file
            original = path.read_text()
            if original.count(old) != 1:
                print(f"{name}: its text occurs {original.count(old)} times in {file}, not once", flush=True)
                gaps.append(name)
                continue
            path.write_text(original.replace(old, new))
            try:
                built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                                       capture_output=True, text=True)
                if built.returncode:
                    print(f"{name}: does not build\n{built.stderr[-800:]}", flush=True)
                    gaps.append(name)
                    continue
                try:
                    ran = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                          *TESTS], cwd=tree, capture_output=True, text=True, timeout=TIMEOUT_S)
                except subprocess.TimeoutExpired:  # a fault that deadlocks the tests is seen, if not as a failure
                    print(f"{name}: killed (the tests hung past {TIMEOUT_S} s)", flush=True)
                    continue
                last = ran.stdout.strip().splitlines()[-1] if ran.stdout.strip() else ""
                if ran.returncode:
                    print(f"{name}: killed ({last})", flush=True)
                elif name in EQUIVALENT:
                    print(f"{name}: survived, equivalent: {EQUIVALENT[name]}", flush=True)
                else:
                    print(f"{name}: SURVIVED ({last})", flush=True)
                    gaps.append(name)
            finally:
                path.write_text(original)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(gaps)} gap(s){': ' + ', '.join(gaps) if gaps else ''}")
    return 1 if gaps else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="*", default=[], help="run only these faults, by name")
    p.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    a = p.parse_args(argv)
    return run(a.only, a.keep)


if __name__ == "__main__":
    sys.exit(main())
