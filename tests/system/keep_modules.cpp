// Preloaded into the ranks of `make asan` (tests/system/asan.sh): dlclose
// does nothing, so the components Open MPI loads with dlopen (mca_*.so) stay
// mapped until the process ends. LeakSanitizer checks at exit, after
// MPI_Finalize has closed them; an allocation made inside a closed
// component then shows only an "<unknown module>" frame, which no
// suppression can name. With them mapped, the fast unwinder's first frame
// names the component (lsan.supp: mca_), and the slow unwinder, which made
// every malloc cost a full stack walk (the sanitized suites three to nine
// times slower), is not needed. Built without instrumentation.
extern "C" int dlclose(void* /*handle*/) { return 0; }
