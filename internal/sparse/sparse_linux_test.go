package sparse

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sparseFile makes a file of size bytes holding data at offs (and holes
// elsewhere).
func sparseFile(t *testing.T, size int64, data map[int64]string) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off, s := range data {
		if _, err := f.WriteAt([]byte(s), off); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func allocated(t *testing.T, name string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(name, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestSparseTar: a 1 GiB file with three bits of data travels as a few
// KiB of tar, reads back (Go's reader and GNU tar) as the same bytes, and
// lands with its holes.
func TestSparseTar(t *testing.T) {
	const size = 1 << 30
	data := map[int64]string{0: "head", 512 << 20: "middle", size - 3: "end"}
	f := sparseFile(t, size, data)
	ex, err := Extents(f, size)
	if err != nil {
		t.Fatal(err)
	}
	if !Sparse(ex, size) || len(ex) != 3 {
		t.Fatalf("extents %v", ex)
	}

	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	mod := time.Unix(1700000000, 5)
	tw.WriteHeader(&tar.Header{Name: "before", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3})
	tw.Write([]byte("abc"))
	h := &tar.Header{Name: "dir/" + strings.Repeat("long", 40), Mode: 0o640, Uid: 1000, Gid: 1000, Uname: "u", Size: size, ModTime: mod}
	if err := WriteTar(tw, &out, h, f, ex, make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	tw.WriteHeader(&tar.Header{Name: "after", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	tw.Write([]byte("yz"))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if out.Len() > 64<<10 {
		t.Errorf("the tar of a 1 GiB sparse file is %d bytes", out.Len())
	}

	dir := t.TempDir()
	tr := tar.NewReader(bytes.NewReader(out.Bytes()))
	var names []string
	for {
		th, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, th.Name)
		if th.Name != h.Name {
			continue
		}
		if th.Size != size || th.Mode != 0o640 || th.Uid != 1000 || th.Uname != "u" || !th.ModTime.Equal(mod) {
			t.Errorf("header %+v", th)
		}
		dst, err := os.Create(filepath.Join(dir, "copy"))
		if err != nil {
			t.Fatal(err)
		}
		w := NewWriter(dst)
		if _, err := io.Copy(w, tr); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		dst.Close()
	}
	if strings.Join(names, ",") != "before,"+h.Name+",after" {
		t.Errorf("entries %q", names)
	}
	copyPath := filepath.Join(dir, "copy")
	fi, err := os.Stat(copyPath)
	if err != nil || fi.Size() != size {
		t.Fatalf("copy: %v %v", fi, err)
	}
	if a := allocated(t, copyPath); a > 1<<20 {
		t.Errorf("the copy allocates %d bytes", a)
	}
	c, _ := os.Open(copyPath)
	defer c.Close()
	for off, s := range data {
		b := make([]byte, len(s))
		c.ReadAt(b, off)
		if string(b) != s {
			t.Errorf("at %d: %q, want %q", off, b, s)
		}
	}

	if _, err := exec.LookPath("tar"); err == nil {
		// GNU tar lists the entry under its real name and size.
		cmd := exec.Command("tar", "-tvf", "-")
		cmd.Stdin = bytes.NewReader(out.Bytes())
		b, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(b), " 1073741824 ") || !strings.Contains(string(b), h.Name) {
			t.Errorf("GNU tar lists: %v\n%s", err, b)
		}
	}
}

func TestWriterHoles(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "w"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := NewWriter(f)
	chunk := make([]byte, 1<<20)
	for range 64 {
		w.Write(chunk)
	}
	w.Write([]byte("x"))
	w.Write(make([]byte, 100))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	if fi.Size() != 64<<20+101 || w.Size() != fi.Size() {
		t.Errorf("size %d", fi.Size())
	}
	if a := allocated(t, f.Name()); a > 64<<10 {
		t.Errorf("allocates %d", a)
	}
	b := make([]byte, 2)
	f.ReadAt(b, 64<<20)
	if string(b) != "x\x00" {
		t.Errorf("read %q", b)
	}
}
