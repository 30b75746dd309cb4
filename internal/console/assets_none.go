//go:build !consoleui

package console

import "embed"

// bundle stands in for the scripts in a build without them (a plain `go
// build`, without npm): its page says how to get the console.
//
//go:embed fallback
var bundle embed.FS

const bundleDir = "fallback"
