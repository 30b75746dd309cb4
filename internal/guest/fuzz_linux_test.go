package guest

import (
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
