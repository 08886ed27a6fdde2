"""Every external repository of the build: Debian packages, the CUDA toolkit, and the local
stand-ins for repositories Bazel itself asks for. Nothing is fetched from the network.

Another Bazel workspace embeds patrickstar_cc's libraries with (see examples/embed/WORKSPACE):

    local_repository(name = "patrickstar_cc", path = "/path/to/patrickstar_cc")
    load("@patrickstar_cc//third_party:repositories.bzl", "patrickstar_cc_repositories")
    patrickstar_cc_repositories()

Every path is resolved inside this repository, whichever workspace is the main one, and a
repository the caller already declared (its own @com_google_absl, say) is left alone, so a
project can bind the upstream names to its own copies by declaring them before the call.
"""

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

def _shim_repository_impl(ctx):
    # The shim's files are in this repository's third_party/shims/<shim>: found from a file of
    # this package, not from the main workspace's root, so the same call works from a workspace
    # that embeds patrickstar_cc.
    src = ctx.path(ctx.attr._anchor).dirname.get_child("shims").get_child(ctx.attr.shim)
    if not src.exists:
        fail("patrickstar_cc: the shim directory {} is missing".format(src))
    for entry in src.readdir():
        ctx.symlink(entry, entry.basename)

# A local stand-in repository whose files are third_party/shims/<shim> of this repository.
_shim_repository = repository_rule(
    implementation = _shim_repository_impl,
    attrs = {
        "shim": attr.string(mandatory = True),
        "_anchor": attr.label(default = Label("//third_party:repositories.bzl"), allow_single_file = True),
    },
    local = True,
)

def _maybe(repository_rule, name, **kwargs):
    if not native.existing_rule(name):
        repository_rule(name = name, **kwargs)

def patrickstar_cc_repositories():
    """Declares every external repository patrickstar_cc needs that is not declared yet.

    Call from WORKSPACE: this repository's own, or any workspace that embeds it (see the file
    comment).
    """
    _maybe(_shim_repository, name = "rules_cc", shim = "rules_cc")
    _maybe(_shim_repository, name = "rules_java", shim = "rules_java")
    _maybe(_shim_repository, name = "remote_coverage_tools", shim = "remote_coverage_tools")

    _maybe(system_library, name = "com_google_absl", targets = _absl_targets())
    _maybe(system_library, name = "com_github_gflags_gflags", targets = {"gflags": ["gflags"]})
    _maybe(system_library, name = "com_github_google_glog", targets = {"glog": ["libglog"]})
    _maybe(
        system_library,
        name = "com_google_googletest",
        targets = {
            "gtest": ["gmock", "gtest", "-pthread"],
            "gtest_main": ["gmock_main", "gmock", "gtest", "-pthread"],
        },
    )
    _maybe(
        system_library,
        name = "com_github_google_benchmark",
        targets = {
            "benchmark": ["benchmark"],
            "benchmark_main": ["-lbenchmark_main", "benchmark"],
        },
    )
    _maybe(
        system_library,
        name = "com_github_google_highway",
        targets = {
            "hwy": ["libhwy"],
            "hwy_contrib": ["libhwy-contrib", "libhwy"],
            "hwy_test_util": ["libhwy-test", "libhwy", "@com_google_googletest//:gtest"],
        },
    )
    _maybe(system_library, name = "openblas", targets = {"openblas": ["openblas"]})
    _maybe(system_library, name = "com_github_nlohmann_json", targets = {"json": ["nlohmann_json"]})
    _maybe(system_library, name = "openmpi", targets = {"mpi": ["ompi"]})
    # Tokenizers: SentencePiece models (Llama-2), NFC normalization (Qwen2's tokenizer.json).
    _maybe(
        system_library,
        name = "com_github_google_sentencepiece",
        targets = {"sentencepiece": ["sentencepiece"]},
    )
    _maybe(system_library, name = "utf8proc", targets = {"utf8proc": ["libutf8proc"]})
    # io_uring for the disk tier (disk/io_uring_engine.h).
    _maybe(system_library, name = "liburing", targets = {"liburing": ["liburing"]})

    # oneDNN (Debian libdnnl-dev, OpenMP runtime): the bf16 GEMMs of model/kernels. The package
    # ships no pkg-config file, so the link flags are given directly (libgomp: its threads are set
    # with omp_set_num_threads).
    _maybe(system_library, name = "onednn", targets = {"dnnl": ["-ldnnl", "-lgomp"]})
    _maybe(cuda_configure, name = "local_config_cuda")
