package gvisor

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRootTmp: a root's /tmp directory is bound as it is, a missing one
// is made (mode 1777), and one that is a link or a file, which a hostile
// image or an earlier sandbox's snapshot may hold, is never followed on
// the host: it is left to gVisor.
func TestRootTmp(t *testing.T) {
	outside := t.TempDir()
	cases := []struct {
		name  string
		setup func(root string) error
		bound bool
	}{
		{"directory", func(root string) error { return os.Mkdir(filepath.Join(root, "tmp"), 0o700) }, true},
		{"missing", func(string) error { return nil }, true},
		{"absolute link", func(root string) error { return os.Symlink(outside, filepath.Join(root, "tmp")) }, false},
		{"relative link", func(root string) error { return os.Symlink("../../..", filepath.Join(root, "tmp")) }, false},
		{"file", func(root string) error { return os.WriteFile(filepath.Join(root, "tmp"), nil, 0o600) }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			if err := c.setup(root); err != nil {
				t.Fatal(err)
			}
			got, err := rootTmp(root)
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(root, "tmp"); c.bound != (got == want) || (!c.bound && got != "") {
				t.Fatalf("rootTmp = %q; bound %v", got, c.bound)
			}
			if c.name == "missing" {
				fi, err := os.Lstat(got)
				if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
					t.Fatalf("the made /tmp: %v, %v; want a directory of mode 1777", fi.Mode(), err)
				}
			}
		})
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("something was made through a link: %v", entries)
	}
}

// TestRestoredTmp: a checkpoint binds the root's /tmp again only when it
// was taken with it bound (older checkpoints had gVisor's tmpfs, saved
// with their kernel).
func TestRestoredTmp(t *testing.T) {
	image, root := t.TempDir(), t.TempDir()
	if got, err := restoredTmp(image, root); err != nil || got != "" {
		t.Fatalf("without the mark: %q, %v; want gVisor's tmpfs", got, err)
	}
	if err := os.WriteFile(filepath.Join(image, tmpOnDiskName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := restoredTmp(image, root); err != nil || got != filepath.Join(root, "tmp") {
		t.Fatalf("with the mark: %q, %v; want the root's /tmp", got, err)
	}
}
