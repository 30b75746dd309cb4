//go:build consoleui

package console

import "embed"

// bundle is what `make build` bundles from web/ (scripts/console-assets.sh).
//
//go:embed dist
var bundle embed.FS

const bundleDir = "dist"
