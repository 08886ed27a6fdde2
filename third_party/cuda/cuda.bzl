"""`cuda_library`: compiles .cu files with nvcc into a cc_library.

Device code lives in .cu files; host code that merely calls the CUDA runtime stays ordinary C++ in a
cc_library that depends on @local_config_cuda//cuda:cudart. Code emitted for sm_80 (A100) and sm_90
(H100/H200) plus compute_90 PTX so newer GPUs can JIT it. Without `--config=cuda` these targets are
incompatible and skipped by wildcard builds.
"""

load("@local_config_cuda//cuda:defs.bzl", "NVCC")

CUDA_ONLY = select({
    "//third_party/cuda:enabled": [],
    "//conditions:default": ["//third_party/cuda:incompatible"],
})

_GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def _nvcc_objects_impl(ctx):
    cc = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps]).compilation_context
    args = ["-c", "-std=c++20", "-Xcompiler=-fPIC,-Wall,-Werror", "--Werror=all-warnings", "-lineinfo"] + _GENCODE
    args += ["-g"] if ctx.var["COMPILATION_MODE"] == "dbg" else ["-O3"]
    args += ["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path]
    args += ["-I" + p for p in cc.includes.to_list() + cc.quote_includes.to_list()]
    args += ["-isystem=" + p for p in cc.system_includes.to_list()]
    args += ["-D" + d for d in cc.defines.to_list() + cc.local_defines.to_list()]
    args += ctx.attr.copts
    outs = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file("_nvcc/{}/{}.pic.o".format(ctx.label.name, src.basename[:-len(src.extension) - 1]))
        ctx.actions.run(
            executable = NVCC,
            arguments = args + [src.path, "-o", out.path],
            inputs = depset([src] + ctx.files.hdrs, transitive = [cc.headers]),
            outputs = [out],
            mnemonic = "NvccCompile",
            progress_message = "Compiling {} with nvcc".format(src.short_path),
            use_default_shell_env = True,
        )
        outs.append(out)
    return [DefaultInfo(files = depset(outs))]

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, testonly = False, **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc (host and device code)."""
    _nvcc_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@local_config_cuda//cuda:cuda_headers"],
        copts = copts,
        target_compatible_with = CUDA_ONLY,
        testonly = testonly,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"],
        hdrs = hdrs,
        deps = deps + ["@local_config_cuda//cuda:cudart"],
        target_compatible_with = CUDA_ONLY,
        visibility = visibility,
        testonly = testonly,
        **kwargs
    )
