package spare

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestGiveTake: a given file comes back empty under the next name, as
// the same inode; a name that exists is never replaced; with no spare,
// Take leaves the name to the caller.
func TestGiveTake(t *testing.T) {
	dir := t.TempDir()
	f, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log"), filepath.Join(dir, "c.log")
	if f.Take(a) {
		t.Fatal("took a spare when there is none")
	}
	if err := os.WriteFile(a, []byte("sandbox a's secret output"), 0o600); err != nil {
		t.Fatal(err)
	}
	ino := inode(t, a)
	if !f.Give(a, Truncate) {
		t.Fatal("Give refused a regular file")
	}
	if _, err := os.Stat(a); !os.IsNotExist(err) {
		t.Errorf("the given file is still under its name: %v", err)
	}
	// A name that exists keeps its file; the spare stays.
	if err := os.WriteFile(c, []byte("c's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if f.Take(c) {
		t.Error("Take replaced a file that exists")
	}
	if got, _ := os.ReadFile(c); string(got) != "c's" {
		t.Errorf("c = %q after a refused Take", got)
	}
	if f.Len() != 1 {
		t.Fatalf("%d spares, want 1", f.Len())
	}
	if !f.Take(b) {
		t.Fatal("Take found no spare")
	}
	if inode(t, b) != ino {
		t.Error("the spare taken is not the file given")
	}
	if got, err := os.ReadFile(b); err != nil || len(got) != 0 {
		t.Errorf("the spare taken holds %q (%v), want nothing", got, err)
	}
	// Not a file of its own: refused, left to the caller.
	if err := os.Link(c, filepath.Join(dir, "c2.log")); err != nil {
		t.Fatal(err)
	}
	if f.Give(c, Truncate) {
		t.Error("Give took a file with two links")
	}
	if f.Give(filepath.Join(dir, "missing.log"), Truncate) {
		t.Error("Give took a missing file")
	}
	if err := os.Symlink(b, filepath.Join(dir, "sym.log")); err != nil {
		t.Fatal(err)
	}
	if f.Give(filepath.Join(dir, "sym.log"), Truncate) {
		t.Error("Give took a symlink")
	}
	if f.Len() != 0 {
		t.Errorf("%d spares after refused gives, want 0", f.Len())
	}
}

// TestBoundAndRestart: at most Max spares are kept, under concurrent
// gives; Open deletes the spares an earlier daemon left and nothing else.
func TestBoundAndRestart(t *testing.T) {
	dir := t.TempDir()
	f, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	given := make(chan bool, 2*Max)
	for i := range 2 * Max {
		p := filepath.Join(dir, fmt.Sprintf("s%d.log", i))
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			given <- f.Give(p, Truncate)
		}()
	}
	wg.Wait()
	close(given)
	n := 0
	for ok := range given {
		if ok {
			n++
		}
	}
	if n != Max || f.Len() != Max {
		t.Errorf("%d given, %d spares; want %d", n, f.Len(), Max)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2*Max {
		t.Fatalf("%d files, want %d", len(ents), 2*Max)
	}
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	ents, _ = os.ReadDir(dir)
	if len(ents) != Max {
		t.Errorf("%d files after Open, want the %d not given", len(ents), Max)
	}
	for _, e := range ents {
		if e.Name()[0] == '.' {
			t.Errorf("Open left %s", e.Name())
		}
	}
}

// TestDirectories: a directory is given with the caller's emptying, and
// one that fails it stays where it was; Open deletes spare directories
// whole.
func TestDirectories(t *testing.T) {
	root := t.TempDir()
	pool := filepath.Join(root, "spare")
	if err := os.Mkdir(pool, 0o700); err != nil {
		t.Fatal(err)
	}
	p, err := Open(pool)
	if err != nil {
		t.Fatal(err)
	}
	a := filepath.Join(root, "a")
	if err := os.MkdirAll(filepath.Join(a, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a, "sub", "f"), []byte("a's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if p.Give(a, func(string) error { return os.ErrInvalid }) {
		t.Fatal("Give kept a directory its emptying refused")
	}
	if _, err := os.Stat(filepath.Join(a, "sub", "f")); err != nil {
		t.Fatalf("a refused directory moved: %v", err)
	}
	if !p.Give(a, func(d string) error { return os.Remove(filepath.Join(d, "sub", "f")) }) {
		t.Fatal("Give refused a directory")
	}
	b := filepath.Join(root, "b")
	if !p.Take(b) {
		t.Fatal("no spare directory to take")
	}
	if ents, _ := os.ReadDir(filepath.Join(b, "sub")); len(ents) != 0 {
		t.Errorf("the spare directory holds %v", ents)
	}
	// One left by an earlier daemon, not empty: deleted whole.
	if !p.Give(b, func(string) error { return nil }) {
		t.Fatal("Give refused a directory")
	}
	ents, _ := os.ReadDir(pool)
	if len(ents) != 1 {
		t.Fatalf("the pool holds %v, want one spare", ents)
	}
	if err := os.WriteFile(filepath.Join(pool, ents[0].Name(), "sub", "left"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(pool); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(pool); len(ents) != 0 {
		t.Errorf("Open left %v", ents)
	}
}
