#!/bin/sh
echo "coverage tools are not available in this offline build (see third_party/shims)" >&2
exit 1
