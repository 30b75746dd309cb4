//go:build !linux

package cli

import (
	"io"
	"os"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// extractTar, in a client-only build: untar, which keeps a hostile tar's
// entries inside the target, is Linux's (openat2), so a
// directory is not copied out here; a single file is.
func extractTar(*os.File, io.Reader, bool, func(string) string, int64) error {
	return errdefs.New(errdefs.ErrUnavailable, "copying a directory out of a sandbox needs Linux (its tar is unpacked with openat2); copy its files one by one")
}
