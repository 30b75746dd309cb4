#!/usr/bin/env bash
# fuzz.sh FUZZTIME: runs every Fuzz* function of the module, one at a
# time, for FUZZTIME each (new targets are found, not listed). The corpora
# are committed under each package's testdata/fuzz/; a failing input is
# written there too, to be committed with its fix.
#
# Go 1.26's fuzz coordinator can fail a target at the end of -fuzztime with
# "context deadline exceeded" and no failing input (golang/go#75804, fixed
# in Go 1.27). A target that fails without writing an input is run once
# more; one that writes an input, or fails twice, fails the run.
#
# The coordinator kills its workers at the end, before their cleanups
# run: a target's t.TempDir and f.TempDir would stay behind. Each run
# gets a TMPDIR of its own, removed after it.
set -euo pipefail
fuzztime=${1:?usage: fuzz.sh FUZZTIME}
scratch=$(mktemp -d -t paddock-fuzz.XXXXXX)
trap 'rm -rf --one-file-system "$scratch"' EXIT

targets=$(go test -list '^Fuzz' ./... | awk '
	/^Fuzz/ { names = names " " $1; next }
	/^ok/   { n = split(names, a, " "); for (i = 1; i <= n; i++) print $2 "@" a[i] }
	        { names = "" }')
echo "fuzz: $(echo $targets | wc -w) targets, $fuzztime each"

inputs() { ls "$1" 2>/dev/null | sort || true; }

for t in $targets; do
	pkg=${t%@*} name=${t#*@}
	corpus=$(go list -f '{{.Dir}}' "$pkg")/testdata/fuzz/$name
	for try in 1 2; do
		echo "fuzz: $pkg $name"
		before=$(inputs "$corpus")
		rm -rf --one-file-system "$scratch"/t && mkdir "$scratch"/t
		if TMPDIR=$scratch/t go test -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime" "$pkg"; then
			break
		fi
		if [ "$(inputs "$corpus")" != "$before" ] || [ "$try" = 2 ]; then
			echo "fuzz: $name failed" >&2
			exit 1
		fi
		echo "fuzz: $name failed without a failing input (golang/go#75804); once more"
	done
done
