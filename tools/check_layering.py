#!/usr/bin/env python3
"""Fails when a Bazel package depends on a package above it in docs/architecture.md's graph.

The package graph is the fenced block tagged `layering` in docs/architecture.md: the picture the
documentation shows is the rule this script enforces, so the two cannot drift apart. Each line
`A -> B C` says that the targets of node A may depend on nodes B and C and, through them, on
everything B and C may depend on. A node is a package path; a Bazel package belongs to the node
that is its longest path prefix (`model/kernels/cuda` is in `model/kernels`, `memory/testing` in
`memory`). The graph must be acyclic, and every package of the workspace must belong to a node.

The rules, per dependency edge of `bazel query 'deps(//..., 1)'` (every attribute: deps, data,
srcs, and every select() branch, so CUDA-only edges count too; implicit toolchain deps and
external repositories aside; //third_party binds external libraries and may be used by anyone):

  - a target that is not testonly (libraries and binaries: what other projects embed and what
    ships) may depend only on its own node and on nodes reachable from it along the arrows —
    strictly down the graph; a sideways edge (optimizer -> scheduler) fails as an upward one does;
  - a testonly target (tests, fakes in testing/, benchmarks) may also reach sideways, since a
    test may use a sibling to drive its subject (model's LoRA test trains with optimizer's Adam),
    but never up: it fails when its node is reachable from the node it depends on, unless the
    block names that exact edge on a line `except //pkg:test -> //pkg:target` (with the reason
    in a comment); an exception that no longer matches an upward edge fails too.

Run by hand from the repository root:
  tools/check_layering.py                    # runs bazel query, checks, exit 0 or 1
  tools/check_layering.py --edges=FILE       # checks a saved `--output=graph` edge list instead
  tools/check_layering.py --print_graph      # the parsed graph and each node's allowed set
Exit status: 0 when every edge is allowed, 1 on a violation (each printed with the target, the
dependency and the rule it breaks), 2 when the graph block is missing or malformed.
tools/check_layering_test.py shows it failing on a deliberately wrong graph.
"""

import argparse
import os
import re
import subprocess
import sys

FENCE_TAG = "layering"
EXTERNAL_PACKAGES = ("third_party",)


class GraphError(Exception):
    """The documented graph is missing or malformed (exit 2)."""


def parse_graph(markdown):
    """({node: [direct lower nodes]}, {(from, to) test-only exceptions}) from the ```layering
    block of `markdown`, nodes in line order."""
    match = re.search(r"^```" + FENCE_TAG + r"[ \t]*\n(.*?)^```", markdown, re.M | re.S)
    if not match:
        raise GraphError(f"no ```{FENCE_TAG} block found")
    graph = {}
    exceptions = set()
    for number, raw in enumerate(match.group(1).splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("except "):
            labels = re.fullmatch(r"except\s+(//\S+:\S+)\s*->\s*(//\S+:\S+)", line)
            if not labels:
                raise GraphError(f"line {number}: expected 'except //pkg:target -> //pkg:target'")
            exceptions.add(labels.groups())
            continue
        if "->" not in line:
            raise GraphError(f"line {number} of the {FENCE_TAG} block has no '->': {raw!r}")
        left, right = (part.strip() for part in line.split("->", 1))
        if not re.fullmatch(r"[a-z0-9_]+(/[a-z0-9_]+)*", left):
            raise GraphError(f"line {number}: '{left}' is not a package path")
        if left in graph:
            raise GraphError(f"line {number}: node '{left}' is declared twice")
        graph[left] = right.replace(",", " ").split()
    for node, lower in graph.items():
        for target in lower:
            if target not in graph:
                raise GraphError(f"node '{node}' points to '{target}', which has no line of its own")
    # Acyclic: "above" means nothing otherwise.
    state = {}

    def visit(node, path):
        if state.get(node) == "done":
            return
        if state.get(node) == "open":
            raise GraphError("the graph has a cycle: " + " -> ".join(path + [node]))
        state[node] = "open"
        for target in graph[node]:
            visit(target, path + [node])
        state[node] = "done"

    for node in graph:
        visit(node, [])
    return graph, exceptions


def below(graph):
    """{node: set of nodes reachable from it (not itself)}."""
    result = {}

    def reach(node):
        if node not in result:
            result[node] = set()
            for target in graph[node]:
                result[node] |= {target} | reach(target)
        return result[node]

    for node in graph:
        reach(node)
    return result


def node_of(package, graph):
    """The node a package belongs to: its longest path prefix that is a node, else None."""
    parts = package.split("/")
    for n in range(len(parts), 0, -1):
        candidate = "/".join(parts[:n])
        if candidate in graph:
            return candidate
    return None


def package_of(label):
    """'//a/b:c' -> 'a/b'; None for external labels ('@x//...')."""
    if not label.startswith("//"):
        return None
    return label[2:].split(":", 1)[0]


def is_external(package):
    return package.split("/", 1)[0] in EXTERNAL_PACKAGES


def check(graph, edges, testonly, packages, exceptions=frozenset()):
    """Violations (strings) of `edges` [(from_label, to_label)] against `graph`.

    `testonly`: the set of testonly rule labels; `packages`: every package of the workspace;
    `exceptions`: (from, to) edges of testonly targets allowed upward by name. An exception that
    names no upward test-only edge any more is a violation too (the document must stay true)."""
    reach = below(graph)
    problems = []
    used = set()
    for package in sorted(packages):
        if not is_external(package) and node_of(package, graph) is None:
            problems.append(
                f"package //{package} belongs to no node of the graph: add it to the "
                f"```{FENCE_TAG} block of docs/architecture.md")
    for source, target in sorted(set(edges)):
        src_pkg, dst_pkg = package_of(source), package_of(target)
        if src_pkg is None or dst_pkg is None or is_external(src_pkg) or is_external(dst_pkg):
            continue
        src, dst = node_of(src_pkg, graph), node_of(dst_pkg, graph)
        if src is None or dst is None or src == dst:
            continue
        if source in testonly:
            if src in reach[dst] and (source, target) in exceptions:
                used.add((source, target))
            elif src in reach[dst]:
                problems.append(
                    f"{source} -> {target}: a test-only target of '{src}' depends on '{dst}', "
                    f"which is above it ('{dst}' reaches '{src}' in the graph)")
        elif dst not in reach[src]:
            where = "above" if src in reach[dst] else "beside"
            problems.append(
                f"{source} -> {target}: '{src}' may not depend on '{dst}' ({where} it; "
                f"'{src}' may use: {', '.join(sorted(reach[src])) or 'nothing'})")
    for source, target in sorted(set(exceptions) - used):
        problems.append(f"except {source} -> {target}: no such upward test-only edge exists any "
                        f"more; remove the exception from the ```{FENCE_TAG} block")
    return problems


GRAPH_EDGE = re.compile(r'^\s*"([^"]+)"\s*->\s*"([^"]+)"')


def parse_graph_output(text):
    """Edges of `bazel query --output=graph --nograph:factored`."""
    return [m.groups() for m in map(GRAPH_EDGE.match, text.splitlines()) if m]


def bazel_query(args):
    command = ["bazel", "query", "--noshow_progress", "--noimplicit_deps", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"check_layering: `{' '.join(command)}` failed ({done.returncode})")
    return done.stdout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--doc", default=os.path.join(root, "docs", "architecture.md"))
    parser.add_argument("--edges", help="a saved `bazel query --output=graph "
                        "--nograph:factored 'deps(//..., 1)'`; with it, testonly is read from "
                        "--testonly and packages from the edges")
    parser.add_argument("--testonly", help="a file of testonly labels, one a line (with --edges)")
    parser.add_argument("--print_graph", action="store_true")
    args = parser.parse_args(argv)

    try:
        with open(args.doc) as f:
            graph, exceptions = parse_graph(f.read())
    except (OSError, GraphError) as e:
        print(f"check_layering: {args.doc}: {e}", file=sys.stderr)
        return 2
    if args.print_graph:
        reach = below(graph)
        for node in graph:
            print(f"{node:16} may use: {', '.join(sorted(reach[node])) or '-'}")
        return 0

    if args.edges:
        with open(args.edges) as f:
            edges = parse_graph_output(f.read())
        testonly = set()
        if args.testonly:
            with open(args.testonly) as f:
                testonly = {line.strip() for line in f if line.strip()}
        packages = {p for e in edges for p in map(package_of, e) if p is not None}
    else:
        os.chdir(root)
        edges = parse_graph_output(
            bazel_query(["--output=graph", "--nograph:factored", "deps(//..., 1)"]))
        testonly = set(bazel_query(
            ["attr(testonly, 1, //...) union tests(//...)"]).split())
        packages = set(bazel_query(["//...", "--output=package"]).split())

    problems = check(graph, edges, testonly, packages, exceptions)
    for p in problems:
        print(f"LAYERING VIOLATION: {p}")
    if problems:
        print(f"check_layering: {len(problems)} dependencies break the package graph of "
              f"{os.path.relpath(args.doc, root)} (the ```{FENCE_TAG} block): move the code, or "
              "change the graph there if the design changed")
        return 1
    print(f"check_layering: {len(edges)} edges of {len(packages)} packages follow the graph "
          f"of {os.path.relpath(args.doc, root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
