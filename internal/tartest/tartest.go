// Package tartest makes hostile tar streams for the unpackers' tests and
// fuzz targets: a short script of entries becomes a well-formed tar, so
// that a fuzzer's mutations explore names, links and sizes rather than
// header checksums. It also keeps watch on a host directory that an
// unpacker must never touch.
package tartest

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/sparse"
)

// Script makes a tar from lines "TYPE NAME [ARG]":
//
//	f  a file: ARG is its content, or a number: that many zero bytes
//	s  a sparse file of ARG bytes with one byte of data in the middle
//	d  a directory
//	l  a symbolic link to ARG
//	h  a hard link to ARG
//	p  a fifo
//	c  a character device 0:0 (an OCI whiteout)
//	x  an empty file with the extended attribute ARG (KEY=VALUE)
//
// Lines it cannot make are left out.
func Script(script string) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for line := range strings.Lines(script) {
		parts := strings.SplitN(strings.TrimSuffix(line, "\n"), " ", 3)
		if len(parts) < 2 {
			continue
		}
		h := &tar.Header{Name: parts[1], Mode: 0o755, Format: tar.FormatPAX}
		arg := ""
		if len(parts) == 3 {
			arg = parts[2]
		}
		var body []byte
		switch parts[0] {
		case "f":
			h.Typeflag = tar.TypeReg
			if n, err := strconv.Atoi(arg); err == nil && n >= 0 && n < 4<<20 {
				body = make([]byte, n)
			} else {
				body = []byte(arg)
			}
		case "s":
			n, err := strconv.ParseInt(arg, 10, 64)
			if err != nil || n < 1 || n > 1<<40 {
				continue
			}
			h.Typeflag, h.Size = tar.TypeReg, n
			sparse.WriteTar(tw, &b, h, xBytes{}, []sparse.Extent{{Offset: n / 2, Length: 1}}, make([]byte, 512))
			continue
		case "d":
			h.Typeflag = tar.TypeDir
		case "l":
			h.Typeflag, h.Linkname = tar.TypeSymlink, arg
		case "h":
			h.Typeflag, h.Linkname = tar.TypeLink, arg
		case "p":
			h.Typeflag = tar.TypeFifo
		case "c":
			h.Typeflag = tar.TypeChar
		case "x":
			k, v, _ := strings.Cut(arg, "=")
			h.Typeflag, h.PAXRecords = tar.TypeReg, map[string]string{"SCHILY.xattr." + k: v}
		default:
			continue
		}
		h.Size = int64(len(body))
		if tw.WriteHeader(h) == nil {
			tw.Write(body)
		}
	}
	tw.Close()
	return b.Bytes()
}

// xBytes reads as endless "x".
type xBytes struct{}

func (xBytes) ReadAt(p []byte, _ int64) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// Outside is a host directory holding one secret file, beside the
// directories a test unpacks into.
type Outside struct {
	Base string // the directory holding Dir and the unpack directories
	Dir  string // the outside directory
}

// NewOutside makes Base/outside/secret in a new temporary directory.
func NewOutside(tb testing.TB) *Outside {
	tb.Helper()
	base := tb.TempDir()
	o := &Outside{Base: base, Dir: filepath.Join(base, "outside")}
	if err := os.Mkdir(o.Dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "secret"), []byte("host secret"), 0o600); err != nil {
		tb.Fatal(err)
	}
	return o
}

// Check fails unless the secret is unchanged and alone, and Base holds
// only the outside directory and names starting with prefix.
func (o *Outside) Check(tb testing.TB, prefix string) {
	tb.Helper()
	entries, _ := os.ReadDir(o.Dir)
	b, err := os.ReadFile(filepath.Join(o.Dir, "secret"))
	if len(entries) != 1 || err != nil || string(b) != "host secret" {
		tb.Fatalf("outside the destination changed: %v, %q, %v", entries, b, err)
	}
	all, _ := os.ReadDir(o.Base)
	for _, e := range all {
		if e.Name() != "outside" && !strings.HasPrefix(e.Name(), prefix) {
			tb.Fatalf("%s appeared beside the destination", e.Name())
		}
	}
}

// FileBytes sums the sizes of the regular files under dir.
func FileBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
