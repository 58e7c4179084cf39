/* Prints the CPython struct offsets gpufl's pyframes.rs relies on, for the interpreter whose
 * headers it is compiled against (scripts/gpu-check.sh pyoffsets). Compile with
 * -I$(python3 -c 'import sysconfig;print(sysconfig.get_paths()["include"])'). */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_frame.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_runtime.h"
#define P(T, f) printf("%-44s %zu\n", #T "." #f, offsetof(T, f))
int main(void) {
    printf("PY_VERSION %s\n", PY_VERSION);
    P(PyThreadState, prev);
    P(PyThreadState, next);
    P(PyThreadState, interp);
#if PY_VERSION_HEX >= 0x030C0000
    P(PyThreadState, _status);
    P(PyThreadState, cframe);
#else
    P(PyThreadState, cframe);
#endif
    P(PyThreadState, datastack_chunk);
    P(_PyStackChunk, previous);
    P(_PyStackChunk, size);
    P(_PyStackChunk, data);
    P(PyThreadState, thread_id);
    P(PyThreadState, native_thread_id);
    P(PyInterpreterState, threads.head);
    P(_PyRuntimeState, main_thread);
#if PY_VERSION_HEX < 0x030C0000
    P(_PyRuntimeState, gilstate.tstate_current);
#endif
    P(_PyRuntimeState, interpreters.main);
    P(_PyInterpreterFrame, previous);
    P(_PyInterpreterFrame, owner);
    printf("sizeof(PyThreadState) %zu\n", sizeof(PyThreadState));
#if PY_VERSION_HEX >= 0x030C0000
    {
        PyThreadState t;
        memset(&t, 0, sizeof t);
        t._status.active = 1;
        const unsigned char *b = (const unsigned char *)&t._status;
        printf("_status.active sets byte0=0x%02x\n", b[0]);
    }
#endif
    return 0;
}
