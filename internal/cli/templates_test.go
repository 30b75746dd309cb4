package cli

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// contextEntries runs writeContext and returns the tar's names and file
// contents.
func contextEntries(t *testing.T, dir string, srcs ...string) (map[string]string, error) {
	t.Helper()
	var buf bytes.Buffer
	if err := writeContext(&buf, dir, []byte("name: x\n"), srcs); err != nil {
		return nil, err
	}
	got := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		got[h.Name] = string(data) + h.Linkname
	}
}

// TestWriteContextStaysInside: a copy source reached through a symbolic
// link that leads out of the build context (as one copied out of a
// sandbox may) is refused, not read from the host; links inside what is
// copied are sent as links; links that stay inside are followed.
func TestWriteContextStaysInside(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(outside, filepath.Join(dir, "abs")))
	must(os.Symlink("../"+filepath.Base(outside), filepath.Join(dir, "rel")))
	must(os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "sub", "f"), []byte("inside"), 0o644))
	must(os.Symlink("sub", filepath.Join(dir, "in")))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "sub", "out")))
	// ../ of dir is t.TempDir's parent; make "rel" lead to outside.
	must(os.Remove(filepath.Join(dir, "rel")))
	relTarget, err := filepath.Rel(dir, outside)
	must(err)
	must(os.Symlink(relTarget, filepath.Join(dir, "rel")))

	for _, src := range []string{"abs/secret", "rel/secret", "sub/out/x", "../" + filepath.Base(dir) + "/sub/f", "/etc/passwd"} {
		got, err := contextEntries(t, dir, src)
		if err == nil {
			t.Errorf("src %q: no error; entries %q", src, got)
			continue
		}
		if strings.Contains(err.Error(), "host secret") {
			t.Errorf("src %q: %v", src, err)
		}
	}

	got, err := contextEntries(t, dir, "in/f", "sub", "abs")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"paddock.yaml": "name: x\n",
		"in/f":         "inside",
		"sub":          "",
		"sub/f":        "inside",
		"sub/out":      filepath.Join(outside, "secret"), // a link, as text
		"abs":          outside,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("entry %q = %q, want %q", k, got[k], v)
		}
	}
	for k := range got {
		if strings.Contains(got[k], "host secret") {
			t.Errorf("entry %q carries the host file", k)
		}
	}
}
