package snapshot

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestOpenLayerDirStaysInside: a directory snapshot's path is walked in
// each layer without following links, and a ".." (or empty) element is
// refused rather than walked up out of the layer.
func TestOpenLayerDirStaysInside(t *testing.T) {
	base := t.TempDir()
	layer := filepath.Join(base, "layer")
	os.MkdirAll(filepath.Join(layer, "a/b"), 0o755)
	os.MkdirAll(filepath.Join(base, "outside/etc"), 0o755)
	os.Symlink(filepath.Join(base, "outside"), filepath.Join(layer, "link"))
	for _, rel := range []string{"../outside/etc", "a/../../outside", "a//b", "a/./b"} {
		fd, _, err := openLayerDir(layer, rel)
		if fd >= 0 {
			unix.Close(fd)
		}
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("openLayerDir(%q): fd %d, %v; want ErrInvalid", rel, fd, err)
		}
	}
	// A link hides what is below it in this layer; it is not followed.
	if fd, hides, err := openLayerDir(layer, "link/etc"); fd >= 0 || !hides || err != nil {
		t.Errorf("through a link: fd %d, hides %v, %v", fd, hides, err)
	}
	fd, _, err := openLayerDir(layer, "a/b")
	if err != nil || fd < 0 {
		t.Fatalf("a/b: %d %v", fd, err)
	}
	unix.Close(fd)
}
