package cli

import (
	"io"
	"os"

	"github.com/paddock-dev/paddock/internal/untar"
)

// extractTar unpacks a directory copied out of a sandbox into dir, with
// untar: no entry lands outside dir, whatever the tar
// holds.
func extractTar(dir *os.File, r io.Reader, archive bool, rename func(string) string, limit int64) error {
	_, err := untar.ExtractTar(dir, r, untar.ExtractOptions{Chown: archive, UID: -1, GID: -1, Rename: rename, MaxSize: limit})
	return err
}
