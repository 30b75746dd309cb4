package durable

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// onlyFiles fails t unless dir holds exactly names: no temporary file is
// left behind.
func onlyFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Fatalf("%s holds %v, want %v", dir, got, names)
	}
}

func TestWrite(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(string, []byte, fs.FileMode) error
	}{
		{"WriteFile", WriteFile},
		{"Replace", Replace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "f.json")
			for i, data := range []string{"first", "second, longer"} {
				perm := fs.FileMode(0o600) | fs.FileMode(i)<<2 // 0600, then 0604
				if err := tc.write(p, []byte(data), perm); err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(p)
				if err != nil || string(b) != data {
					t.Fatalf("%s holds %q (%v), want %q", p, b, err, data)
				}
				if fi, _ := os.Stat(p); fi.Mode().Perm() != perm {
					t.Fatalf("mode %v, want %v", fi.Mode().Perm(), perm)
				}
			}
			onlyFiles(t, dir, "f.json")
			// A write that cannot finish leaves the old file and no temporary.
			if err := tc.write(filepath.Join(dir, "missing", "g"), []byte("x"), 0o600); err == nil {
				t.Fatal("wrote into a missing directory")
			}
			if err := os.Mkdir(filepath.Join(dir, "d"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := tc.write(filepath.Join(dir, "d"), []byte("x"), 0o600); err == nil {
				t.Fatal("replaced a directory")
			}
			onlyFiles(t, dir, "d", "f.json")
		})
	}
}

func TestCreate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	if err := Create(p, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Create(p, []byte("other"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Create: %v, want fs.ErrExist", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "secret" {
		t.Fatalf("key holds %q after a refused Create", b)
	}
}

func TestSyncDir(t *testing.T) {
	if err := SyncDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	err := SyncDir(filepath.Join(t.TempDir(), "missing"))
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("SyncDir of a missing directory: %v", err)
	}
}

func TestLockDir(t *testing.T) {
	dir := t.TempDir()
	l, err := LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// flock conflicts between open files, so a second holder in this
	// process is refused as another process would be.
	if _, err := LockDir(dir); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("second LockDir: %v, want ErrUnavailable naming %s", err, dir)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	l2, err := LockDir(dir)
	if err != nil {
		t.Fatalf("LockDir after Unlock: %v", err)
	}
	l2.Unlock()
}
