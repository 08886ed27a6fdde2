#!/usr/bin/env python3
"""Tests of tools/check_layering.py: it fails on the edges it must refuse (python3, no Bazel).

Run from anywhere: python3 tools/check_layering_test.py (.ci/run runs it before the check)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_layering as cl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GRAPH = """Some prose.

```layering
app     -> lib/io lib    # the top
lib/io  -> base
lib     -> base
base    ->
except //base:base_test -> //app:main   # a named upward test edge
```
"""

PACKAGES = {"app", "lib", "lib/io", "lib/testing", "base", "third_party/x"}


def run(edges, testonly=(), graph_text=GRAPH, packages=PACKAGES):
    graph, exceptions = cl.parse_graph(graph_text)
    used = list(edges) + [("//base:base_test", "//app:main")]  # keeps the exception in use
    return cl.check(graph, used, set(testonly) | {"//base:base_test"}, packages, exceptions)


class CheckTest(unittest.TestCase):
    def test_down_the_graph_passes(self):
        self.assertEqual(run([("//app:main", "//lib:lib"), ("//app:main", "//base:b"),
                              ("//lib/testing:fake", "//lib:lib"), ("//lib:lib", "//base:b"),
                              ("//lib:lib", "//third_party/x:y"), ("//lib:lib", "@absl//a:b"),
                              ("//lib:lib", "//lib:lib.cc")]), [])

    def test_upward_library_edge_fails_naming_it(self):
        problems = run([("//base:b", "//lib:lib")])
        self.assertEqual(len(problems), 1)
        self.assertIn("//base:b -> //lib:lib", problems[0])
        self.assertIn("above it", problems[0])

    def test_sideways_library_edge_fails(self):
        problems = run([("//lib/io:w", "//lib:lib")])
        self.assertEqual(len(problems), 1)
        self.assertIn("beside it", problems[0])

    def test_sub_package_belongs_to_its_longest_prefix(self):
        # lib/testing is in lib: its use of lib/io is sideways for a library ...
        self.assertEqual(len(run([("//lib/testing:fake", "//lib/io:w")])), 1)
        # ... and allowed for a test-only target.
        self.assertEqual(run([("//lib/testing:fake", "//lib/io:w")],
                             testonly={"//lib/testing:fake"}), [])

    def test_test_may_go_sideways_but_not_up(self):
        self.assertEqual(run([("//lib:lib_test", "//lib/io:w")], testonly={"//lib:lib_test"}), [])
        problems = run([("//lib:lib_test", "//app:main")], testonly={"//lib:lib_test"})
        self.assertEqual(len(problems), 1)
        self.assertIn("test-only", problems[0])

    def test_stale_exception_fails(self):
        graph, exceptions = cl.parse_graph(GRAPH)
        problems = cl.check(graph, [], set(), PACKAGES, exceptions)
        self.assertEqual(len(problems), 1)
        self.assertIn("no such upward test-only edge", problems[0])

    def test_exception_does_not_cover_libraries(self):
        graph, exceptions = cl.parse_graph(GRAPH)
        problems = cl.check(graph, [("//base:base_test", "//app:main")], set(), PACKAGES,
                            exceptions)
        self.assertTrue(any("may not depend" in p for p in problems), problems)

    def test_package_outside_the_graph_fails(self):
        problems = run([], packages=PACKAGES | {"newpkg"})
        self.assertEqual(len(problems), 1)
        self.assertIn("//newpkg belongs to no node", problems[0])


class ParseTest(unittest.TestCase):
    def test_malformed_graphs_are_refused(self):
        for text, message in [
            ("no block", "no ```layering block"),
            ("```layering\na -> b\n```\n", "no line of its own"),
            ("```layering\na -> b\nb -> a\n```\n", "cycle"),
            ("```layering\na ->\na ->\n```\n", "declared twice"),
            ("```layering\na b\n```\n", "has no '->'"),
            ("```layering\na ->\nexcept a -> b\n```\n", "expected 'except"),
        ]:
            with self.assertRaisesRegex(cl.GraphError, message):
                cl.parse_graph(text)


class RealGraphTest(unittest.TestCase):
    """docs/architecture.md's own graph against edges this repository had or could grow."""

    def setUp(self):
        with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
            self.text = f.read()
        self.graph, self.exceptions = cl.parse_graph(self.text)
        self.packages = set(self.graph)

    def check(self, edges, testonly=()):
        used = list(edges) + sorted(self.exceptions)
        return cl.check(self.graph, used, set(testonly) | {e[0] for e in self.exceptions},
                        self.packages, self.exceptions)

    def test_the_edge_issue_35_removed_fails(self):
        # disk/ used CRC-32C from trainer/io before it moved to base/.
        problems = self.check([("//disk:file_chunk_swap", "//trainer/io:crc32c")])
        self.assertEqual(len(problems), 1)
        self.assertIn("'disk' may not depend on 'trainer/io'", problems[0])

    def test_optimizer_never_depends_on_the_scheduler(self):
        self.assertEqual(len(self.check([("//optimizer:hybrid_adam", "//scheduler:chunk_manager")])),
                         1)

    def test_todays_kinds_of_edges_pass(self):
        self.assertEqual(self.check([("//scheduler:disk_tier", "//disk:chunk_swap"),
                                     ("//trainer:trainer", "//optimizer:hybrid_adam"),
                                     ("//model:lora_model_test", "//optimizer:cpu_adam")],
                                    testonly={"//model:lora_model_test"}), [])

    def test_a_deliberately_reversed_order_fails(self):
        # The same block with memory placed above chunk: today's chunk -> memory edge then breaks.
        bad = self.text.replace("chunk         -> memory", "chunk         -> base").replace(
            "memory        -> base", "memory        -> chunk")
        graph, exceptions = cl.parse_graph(bad)
        problems = cl.check(graph, [("//chunk:chunk", "//memory:device")], set(), set(graph))
        self.assertTrue(any("//chunk:chunk -> //memory:device" in p for p in problems), problems)


if __name__ == "__main__":
    unittest.main()
