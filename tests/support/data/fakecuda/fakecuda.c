/* A stand-in libcuda.so.1 that records every driver entry point asked for and every cuInit call, and reports
 * "no device". Put its folder first on LD_LIBRARY_PATH; FAKE_CUDA_LOG names the log file. Used to show that the
 * pre-flight checks never initialise CUDA: anything that would create a context must call cuInit first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void note(const char *what, const char *arg) {
    const char *path = getenv("FAKE_CUDA_LOG");
    FILE *f = fopen(path ? path : "/tmp/fakecuda.log", "a");
    if (f) { fprintf(f, "%s %s\n", what, arg ? arg : ""); fclose(f); }
}

int cuInit(unsigned int flags) { (void)flags; note("cuInit", NULL); return 100; /* CUDA_ERROR_NO_DEVICE */ }
int cuDriverGetVersion(int *v) { note("cuDriverGetVersion", NULL); if (v) *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { note("cuDeviceGetCount", NULL); if (n) *n = 0; return 3; /* NOT_INITIALIZED */ }
int cuGetExportTable(const void **t, const void *id) { (void)id; note("cuGetExportTable", NULL); if (t) *t = NULL; return 500; }

int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);

static void *lookup(const char *sym) {
    if (!strcmp(sym, "cuGetProcAddress")) return (void *)cuGetProcAddress_v2;
    if (!strcmp(sym, "cuInit")) return (void *)cuInit;
    if (!strcmp(sym, "cuDriverGetVersion")) return (void *)cuDriverGetVersion;
    if (!strcmp(sym, "cuDeviceGetCount")) return (void *)cuDeviceGetCount;
    if (!strcmp(sym, "cuGetExportTable")) return (void *)cuGetExportTable;
    return NULL;
}

int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    (void)ver; (void)flags;
    note("cuGetProcAddress", sym);
    void *p = lookup(sym);
    if (pfn) *pfn = p;
    if (status) *status = p ? 0 : 1;
    return p ? 0 : 500; /* CUDA_ERROR_NOT_FOUND */
}

int cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags) {
    int status;
    return cuGetProcAddress_v2(sym, pfn, ver, flags, &status);
}
