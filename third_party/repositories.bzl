"""Every external repository of the build: Debian packages, the CUDA toolkit, and the local
stand-ins for repositories Bazel itself asks for. Nothing is fetched from the network."""

load("//third_party:system_library.bzl", "system_library")
load("//third_party/cuda:cuda_configure.bzl", "cuda_configure")

def _absl_targets():
    # upstream label -> pkg-config module (Debian's libabsl-dev 20220623)
    t = {
        "absl/algorithm:container": "absl_algorithm_container",
        "absl/base:base": "absl_base",
        "absl/base:config": "absl_config",
        "absl/base:core_headers": "absl_core_headers",
        "absl/base:log_severity": "absl_log_severity",
        "absl/cleanup:cleanup": "absl_cleanup",
        "absl/container:btree": "absl_btree",
        "absl/container:fixed_array": "absl_fixed_array",
        "absl/container:flat_hash_map": "absl_flat_hash_map",
        "absl/container:flat_hash_set": "absl_flat_hash_set",
        "absl/container:inlined_vector": "absl_inlined_vector",
        "absl/container:node_hash_map": "absl_node_hash_map",
        "absl/debugging:failure_signal_handler": "absl_failure_signal_handler",
        "absl/debugging:stacktrace": "absl_stacktrace",
        "absl/debugging:symbolize": "absl_symbolize",
        "absl/flags:flag": "absl_flags",
        "absl/flags:parse": "absl_flags_parse",
        "absl/flags:usage": "absl_flags_usage",
        "absl/functional:any_invocable": "absl_any_invocable",
        "absl/functional:bind_front": "absl_bind_front",
        "absl/functional:function_ref": "absl_function_ref",
        "absl/hash:hash": "absl_hash",
        "absl/memory:memory": "absl_memory",
        "absl/numeric:bits": "absl_bits",
        "absl/numeric:int128": "absl_int128",
        "absl/random:bit_gen_ref": "absl_random_bit_gen_ref",
        "absl/random:distributions": "absl_random_distributions",
        "absl/random:random": "absl_random_random",
        "absl/status:status": "absl_status",
        "absl/status:statusor": "absl_statusor",
        "absl/strings:str_format": "absl_str_format",
        "absl/strings:strings": "absl_strings",
        "absl/synchronization:synchronization": "absl_synchronization",
        "absl/time:time": "absl_time",
        "absl/types:optional": "absl_optional",
        "absl/types:span": "absl_span",
        "absl/types:variant": "absl_variant",
    }
    return {k: [v] for k, v in t.items()}

def project_repositories():
    """Declares all external repositories. Call from WORKSPACE."""
    native.local_repository(name = "rules_cc", path = "third_party/shims/rules_cc")
    native.local_repository(name = "rules_java", path = "third_party/shims/rules_java")
    native.local_repository(name = "remote_coverage_tools", path = "third_party/shims/remote_coverage_tools")

    system_library(name = "com_google_absl", targets = _absl_targets())
    system_library(name = "com_github_gflags_gflags", targets = {"gflags": ["gflags"]})
    system_library(name = "com_github_google_glog", targets = {"glog": ["libglog"]})
    system_library(
        name = "com_google_googletest",
        targets = {
            "gtest": ["gmock", "gtest", "-pthread"],
            "gtest_main": ["gmock_main", "gmock", "gtest", "-pthread"],
        },
    )
    system_library(
        name = "com_github_google_benchmark",
        targets = {
            "benchmark": ["benchmark"],
            "benchmark_main": ["-lbenchmark_main", "benchmark"],
        },
    )
    system_library(
        name = "com_github_google_highway",
        targets = {
            "hwy": ["libhwy"],
            "hwy_contrib": ["libhwy-contrib", "libhwy"],
            "hwy_test_util": ["libhwy-test", "libhwy", "@com_google_googletest//:gtest"],
        },
    )
    system_library(name = "openblas", targets = {"openblas": ["openblas"]})
    system_library(name = "com_github_nlohmann_json", targets = {"json": ["nlohmann_json"]})
    system_library(name = "openmpi", targets = {"mpi": ["ompi"]})

    # oneDNN (Debian libdnnl-dev, OpenMP runtime): the bf16 GEMMs of model/kernels. The package
    # ships no pkg-config file, so the link flags are given directly (libgomp: its threads are set
    # with omp_set_num_threads).
    system_library(name = "onednn", targets = {"dnnl": ["-ldnnl", "-lgomp"]})
    cuda_configure(name = "local_config_cuda")
