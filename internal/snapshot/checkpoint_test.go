package snapshot

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestCheckpointSums: a sealed checkpoint checks out until a file of it
// is truncated, changed, removed or added, and each damage is named.
func TestCheckpointSums(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(dir string) error
		want   string // in the error; "" for none
	}{
		{"intact", func(string) error { return nil }, ""},
		{"truncated", func(dir string) error { return os.Truncate(filepath.Join(dir, "checkpoint.img"), 100) }, "has 100 bytes, not 4096"},
		{"flipped", func(dir string) error {
			f, err := os.OpenFile(filepath.Join(dir, "checkpoint.img"), os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte{0xff}, 2000)
			return err
		}, "checksum differs"},
		{"missing", func(dir string) error { return os.Remove(filepath.Join(dir, "pages.img")) }, "pages.img is missing"},
		{"added", func(dir string) error { return os.WriteFile(filepath.Join(dir, "extra"), nil, 0o600) }, "extra was not in it"},
		{"sums gone", func(dir string) error { return os.Remove(filepath.Join(filepath.Dir(dir), sumsName)) }, "its sums"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Store{cfg: Config{Dir: t.TempDir()}}
			const id = "snap-abcdefghijkl"
			dir := s.checkpointPath(id)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for name, size := range map[string]int{"checkpoint.img": 4096, "pages.img": 10} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Repeat("x", size)), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.sealCheckpoint(id); err != nil {
				t.Fatal(err)
			}
			if err := tc.damage(dir); err != nil {
				t.Fatal(err)
			}
			err := s.checkCheckpoint(id)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("intact checkpoint: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrConflict)):
				t.Fatalf("got %v, want a conflict saying %q", err, tc.want)
			}
		})
	}
}
