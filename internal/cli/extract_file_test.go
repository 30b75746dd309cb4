package cli

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestExtractFile: the client-only build's copy out takes one regular
// file under its new name and refuses what it cannot keep inside the
// target.
func TestExtractFile(t *testing.T) {
	type entry struct {
		name string
		typ  byte
		body string
	}
	tarOf := func(es ...entry) *bytes.Buffer {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, e := range es {
			tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o640, Size: int64(len(e.body))})
			tw.Write([]byte(e.body))
		}
		tw.Close()
		return &b
	}
	file := entry{"notes.txt", tar.TypeReg, "hello"}
	for _, tc := range []struct {
		name    string
		tar     *bytes.Buffer
		rename  func(string) string
		limit   int64
		wantErr error  // nil: extracted
		mention string // the error names it
	}{
		{"one file", tarOf(file), nil, 0, nil, ""},
		{"renamed", tarOf(file), replaceFirst("copy.txt"), 0, nil, ""},
		{"a directory", tarOf(entry{"d/", tar.TypeDir, ""}), nil, 0, errdefs.ErrUnavailable, "needs Linux"},
		{"a symlink", tarOf(entry{"l", tar.TypeSymlink, ""}), nil, 0, errdefs.ErrUnavailable, "needs Linux"},
		{"a path", tarOf(entry{"../../etc/passwd", tar.TypeReg, "x"}), nil, 0, errdefs.ErrInvalid, "../../etc/passwd"},
		{"dot-dot", tarOf(entry{"..", tar.TypeReg, "x"}), nil, 0, errdefs.ErrInvalid, `".."`},
		{"two entries", tarOf(file, entry{"more", tar.TypeReg, "x"}), nil, 0, errdefs.ErrInvalid, "more than one entry"},
		{"over the cap", tarOf(file), nil, 3, errdefs.ErrTooLarge, "cap of 3 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			d, err := os.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			err = extractFile(d, tc.tar, false, tc.rename, tc.limit)
			ents, _ := os.ReadDir(dir)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.mention) {
					t.Fatalf("error %v, want %v naming %q", err, tc.wantErr, tc.mention)
				}
				if len(ents) != 0 {
					t.Fatalf("a refused copy left %v", ents)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := "notes.txt"
			if tc.rename != nil {
				want = "copy.txt"
			}
			b, err := os.ReadFile(filepath.Join(dir, want))
			if err != nil || string(b) != "hello" || len(ents) != 1 {
				t.Fatalf("%s: %q %v; dir holds %v", want, b, err, ents)
			}
			if fi, _ := os.Stat(filepath.Join(dir, want)); fi.Mode().Perm() != 0o640 {
				t.Errorf("mode %v, want 0640", fi.Mode().Perm())
			}
		})
	}
}
