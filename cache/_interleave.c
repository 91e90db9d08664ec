/* The efw1 decoder's hot loop in one pass: rebuild elements from their byte groups and undo the sign rotation.

   numpy needs 2 passes for fp16 and 9 for rotated fp32 over frames larger than the core's cache; this loop reads
   every group once and writes every element once. It is optional: without a compiler, cache/codec.py does the
   same with numpy (tests compare both). Only lengths are trusted from Python, and they are checked here.

   interleave(groups, out, width, rotate): `groups` holds `width` groups of n bytes back to back (byte k of
   element i at groups[k*n + i]), `out` receives n*width bytes with out[i*width + k] = byte k of element i after
   the optional rotation right by one bit of the little-endian integer the element's bytes make. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static void join2(const uint8_t *g, uint8_t *out, Py_ssize_t n, int rotate) {
    const uint8_t *g0 = g, *g1 = g + n;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)g0[i] | ((uint32_t)g1[i] << 8);
        if (rotate) v = ((v >> 1) | (v << 15)) & 0xFFFFu;
        out[2 * i] = (uint8_t)v;
        out[2 * i + 1] = (uint8_t)(v >> 8);
    }
}

static void join4(const uint8_t *g, uint8_t *out, Py_ssize_t n, int rotate) {
    const uint8_t *g0 = g, *g1 = g + n, *g2 = g + 2 * n, *g3 = g + 3 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)g0[i] | ((uint32_t)g1[i] << 8) | ((uint32_t)g2[i] << 16) | ((uint32_t)g3[i] << 24);
        if (rotate) v = (v >> 1) | (v << 31);
        out[4 * i] = (uint8_t)v;
        out[4 * i + 1] = (uint8_t)(v >> 8);
        out[4 * i + 2] = (uint8_t)(v >> 16);
        out[4 * i + 3] = (uint8_t)(v >> 24);
    }
}

static void join8(const uint8_t *g, uint8_t *out, Py_ssize_t n, int rotate) {
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v = 0;
        for (int k = 0; k < 8; k++) v |= (uint64_t)g[k * n + i] << (8 * k);
        if (rotate) v = (v >> 1) | (v << 63);
        for (int k = 0; k < 8; k++) out[8 * i + k] = (uint8_t)(v >> (8 * k));
    }
}

static PyObject *interleave(PyObject *self, PyObject *args) {
    Py_buffer groups, out;
    int width, rotate;
    if (!PyArg_ParseTuple(args, "y*w*ip", &groups, &out, &width, &rotate)) return NULL;
    PyObject *result = NULL;
    if (width != 2 && width != 4 && width != 8) {
        PyErr_Format(PyExc_ValueError, "element width must be 2, 4 or 8, not %d", width);
    } else if (groups.len != out.len || out.len % width) {
        PyErr_SetString(PyExc_ValueError, "groups and out must be the same size, a multiple of the element width");
    } else {
        Py_ssize_t n = out.len / width;
        Py_BEGIN_ALLOW_THREADS
        if (width == 2) join2(groups.buf, out.buf, n, rotate);
        else if (width == 4) join4(groups.buf, out.buf, n, rotate);
        else join8(groups.buf, out.buf, n, rotate);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&groups);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"interleave", interleave, METH_VARARGS, "interleave(groups, out, width, rotate): rebuild elements from byte groups"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_interleave", NULL, -1, methods};

PyMODINIT_FUNC PyInit__interleave(void) { return PyModule_Create(&module); }
