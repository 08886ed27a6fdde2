// LeakSanitizer suppressions for OpenMPI's own allocations (see BUILD.bazel). Only allocations
// whose stack contains one of these libraries are suppressed; leaks in our code still fail.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libmpi.so\n"
         "leak:libopen-pal.so\n"
         "leak:libopen-rte.so\n"
         "leak:libpmix.so\n"
         "leak:libhwloc.so\n"
         "leak:libevent\n"
         "leak:mca_\n";
}
