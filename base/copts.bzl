"""Compiler options shared by every target of this project (not third-party code)."""

PS_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-sign-compare",
    "-Wno-unused-parameter",
]
