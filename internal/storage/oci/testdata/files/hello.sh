#!/bin/sh
echo "hello from paddock's test image"
