//go:build !linux

package cli

import (
	"io"
	"os"
)

// extractTar, in a client-only build: untar, which keeps a hostile tar's
// entries inside the target, is Linux's (openat2), so only a single file
// is copied out here.
func extractTar(dir *os.File, r io.Reader, archive bool, rename func(string) string, limit int64) error {
	return extractFile(dir, r, archive, rename, limit)
}
