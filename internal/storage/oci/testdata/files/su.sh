#!/bin/sh
# Stands in for a setuid-root binary: the test checks its mode bits, it never runs.
echo "not really su"
