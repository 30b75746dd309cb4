#!/usr/bin/env bash
# console-assets.sh bundles the web console's scripts (internal/console/web)
# into internal/console/dist, which the consoleui build tag embeds. The
# packages come from npm, pinned by web/package-lock.json (`npm ci`), into
# web/node_modules; both it and dist are kept until the lock file or the
# sources change, so a build after the first costs nothing. Without node
# and npm it says so and leaves dist as it is: `make build` then builds a
# binary whose console says how to get its scripts (and go build without
# the tag always works).
set -euo pipefail
cd "$(dirname "$0")/../internal/console/web"
dist=../dist
stamp=$(cat package-lock.json build.mjs src/* | sha256sum | cut -c1-16)
if [ -f "$dist/app.js" ] && [ "$(cat "$dist/.stamp" 2>/dev/null)" = "$stamp" ]; then
	exit 0
fi
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
	echo "console-assets: node and npm are missing (make deps): building the console without its scripts" >&2
	exit 0
fi
lock=$(sha256sum package-lock.json | cut -c1-16)
if [ "$(cat node_modules/.paddock-lock 2>/dev/null)" != "$lock" ]; then
	npm ci --no-audit --no-fund --loglevel=error
	echo "$lock" > node_modules/.paddock-lock
fi
rm -rf "$dist"
node build.mjs
echo "$stamp" > "$dist/.stamp"
echo "console-assets: $(du -sh "$dist" | cut -f1) in internal/console/dist"
