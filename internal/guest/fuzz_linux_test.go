package guest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/tartest"
)

// underRoot fails unless f is the root or below it.
func underRoot(t *testing.T, f *os.File, root, p string) {
	t.Helper()
	got, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if got != root && !strings.HasPrefix(got, root+"/") {
		t.Fatalf("%q resolved to %s, outside the root %s", p, got, root)
	}
}

// FuzzResolveInRoot: whatever path a request names, the file ops'
// resolution (open, parent, mkdirAll) ends under the sandbox's root, in a
// root whose links try every way out (absolute, "..", to a host
// directory, loops), and never changes anything outside it.
func FuzzResolveInRoot(f *testing.F) {
	for _, p := range []string{"/", ".", "a/f", "/up/etc/passwd", "abs/etc", "out/secret", "outsecret",
		"loop/x", "a/b/back/x", "rel/../../..", "/../../x", "dotdot/dotdot/outside/secret", "a/self/self/f",
		"chain/secret", "new/dir/x", "up/new", "out/new", "/proc/self/root", "a/../../outside"} {
		f.Add(p, false)
		f.Add(p, true)
	}
	o := tartest.NewOutside(f)
	root := filepath.Join(o.Base, "root")
	for _, d := range []string{root + "/a/b", root + "/proc"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(root, "a/f"), []byte("inside"), 0o644)
	for name, target := range map[string]string{
		"up": "../../..", "abs": "/", "out": o.Dir, "outsecret": o.Dir + "/secret",
		"loop": "loop", "a/b/back": "../../up", "rel": "a/b", "dotdot": "..", "a/self": ".",
		"chain": "a/b/back/../out",
	} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			f.Fatal(err)
		}
	}
	r, err := openFSRoot(root, "/a")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { r.Close() })
	f.Fuzz(func(t *testing.T, p string, mkdir bool) {
		defer o.Check(t, "root")
		cp, err := r.clean("path", p)
		if err != nil {
			return
		}
		if h, err := r.open(cp, unix.O_PATH); err == nil {
			underRoot(t, h, root, p)
			h.Close()
		}
		if h, _, err := r.parent(cp); err == nil {
			underRoot(t, h, root, p)
			h.Close()
		}
		if mkdir && strings.Count(cp, "/") < 8 {
			if h, err := r.mkdirAll(cp, 0o755, -1, -1); err == nil {
				underRoot(t, h, root, p)
				h.Close()
			}
		}
	})
}

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
