package untar

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/paddock-dev/paddock/internal/tartest"
)

// FuzzExtractTar: a hostile tar extracted into a directory holding links
// that lead out makes nothing outside it, whatever its names, links, hard
// links, types and sizes say, and stays under its size cap. Inputs are
// tartest scripts made into well-formed tars, so that mutations explore
// names, links and sizes rather than checksums (Go's tar reader has its
// own fuzzing), and minimizing an input is cheap.
func FuzzExtractTar(f *testing.F) {
	for _, s := range []string{
		"f a/b/c data\nd a/d",
		"f out/evil x",
		"f up/evil x",
		"l l /\nf l/evil x",
		"l l ../../outside\nf l/evil x",
		"h h outsecret",
		"h h ../outside/secret",
		"f ../evil x",
		"f /abs/evil x",
		"p p\nf p replaced",
		"d d\nl d /\nf d/evil x",
		"l a .\nl a/b ..\nf a/b/evil x",
		"f big 1048577",
		"s sparse 1099511627776",
		"s a 100\ns b 1048000",
	} {
		f.Add(s)
	}
	o := tartest.NewOutside(f)
	const maxSize = 1 << 20
	f.Fuzz(func(t *testing.T, script string) {
		defer o.Check(t, "dest")
		dest, err := os.MkdirTemp(o.Base, "dest")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dest)
		os.Symlink(o.Dir, filepath.Join(dest, "out"))
		os.Symlink("..", filepath.Join(dest, "up"))
		os.Symlink(filepath.Join(o.Dir, "secret"), filepath.Join(dest, "outsecret"))
		d, err := os.Open(dest)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ExtractTar(d, bytes.NewReader(tartest.Script(script)), ExtractOptions{UID: -1, GID: -1, MaxSize: maxSize})
		if n := tartest.FileBytes(dest); n > maxSize {
			t.Fatalf("extracted %d bytes of files past the %d-byte cap", n, maxSize)
		}
	})
}
