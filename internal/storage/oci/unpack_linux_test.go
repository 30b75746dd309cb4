package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

type entry struct {
	hdr  *tar.Header
	data string
}

func reg(name, data string) entry {
	return entry{&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), ModTime: fixtureTime}, data}
}
func dir(name string) entry {
	return entry{hdr: &tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: fixtureTime}}
}
func sym(name, target string) entry {
	return entry{hdr: &tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777, ModTime: fixtureTime}}
}
func lnk(name, target string) entry {
	return entry{hdr: &tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target, ModTime: fixtureTime}}
}

func entriesTar(t testing.TB, entries []entry) []byte {
	t.Helper()
	var hdrs []*tar.Header
	var data [][]byte
	for _, e := range entries {
		e.hdr.Format = tar.FormatPAX
		hdrs = append(hdrs, e.hdr)
		data = append(data, []byte(e.data))
	}
	return writeTar(t, hdrs, data)
}

// unpackBytes runs a raw layer (tar or compressed) through the store's
// unpack path with the right diff ID, so only its content can fail it.
func unpackBytes(t *testing.T, s *Store, raw, uncompressed []byte) (string, *layerInfo, error) {
	t.Helper()
	sum := sha256.Sum256(uncompressed)
	h := hex.EncodeToString(sum[:])
	b := blob{diffID: v1.Hash{Algorithm: "sha256", Hex: h}, size: -1, open: func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}}
	var left atomic.Int64
	left.Store(s.lim.MaxImageSize)
	info, err := s.unpack(context.Background(), b, &left)
	if err != nil {
		if d := layerDirs(t, s); len(d) != 0 {
			t.Errorf("a failed unpack left %v", d)
		}
		return "", nil, err
	}
	return s.layerRoot(h), info, nil
}

// TestUnpackHostile feeds layers built to escape the layer directory,
// forge overlay metadata or exhaust the disk.
func TestUnpackHostile(t *testing.T) {
	needRoot(t)
	outside := t.TempDir()
	target := filepath.Join(outside, "target")
	if err := os.WriteFile(target, []byte("original"), 0o644); err != nil {
		t.Fatal(err)
	}
	checkOutside := func(t *testing.T) {
		t.Helper()
		entries, _ := os.ReadDir(outside)
		if len(entries) != 1 {
			t.Errorf("something was written outside the layer: %v", entries)
		}
		if data, _ := os.ReadFile(target); string(data) != "original" {
			t.Errorf("the file outside the layer changed: %q", data)
		}
	}
	xattrFile := reg("x", "data")
	xattrFile.hdr.PAXRecords = map[string]string{
		"SCHILY.xattr.user.overlay.opaque":      "y",
		"SCHILY.xattr.trusted.overlay.redirect": "/etc",
		"SCHILY.xattr.user.ok":                  "kept",
	}
	setuidFile := reg("bin/tool", "#!/bin/sh\n")
	setuidFile.hdr.Mode = 0o6755
	setuidFile.hdr.Uid, setuidFile.hdr.Gid = 0, 50
	badOwner := reg("owner", "")
	badOwner.hdr.Uid = 1 << 32
	rootFile := reg(".", "")

	for _, tc := range []struct {
		name    string
		entries []entry
		wantErr string // substring; empty: must succeed
		check   func(t *testing.T, root string)
	}{
		{name: "dotdot", entries: []entry{reg("../escape", "x")}, wantErr: `".." component`},
		{name: "dotdot inside", entries: []entry{dir("a/"), reg("a/../../escape", "x")}, wantErr: `".." component`},
		{name: "absolute name stays inside", entries: []entry{reg("/etc/abs.txt", "inside")},
			check: func(t *testing.T, root string) { checkContent(t, root, "etc/abs.txt", "inside") }},
		{name: "write through absolute symlink", entries: []entry{sym("evil", outside), reg("evil/pwned", "x")}, wantErr: "symlink component"},
		{name: "write through relative symlink", entries: []entry{sym("evil", "../../../../../../.."+outside), reg("evil/pwned", "x")}, wantErr: "symlink component"},
		{name: "mkdir through symlink", entries: []entry{sym("evil", outside), dir("evil/sub/")}, wantErr: "symlink component"},
		{name: "whiteout through symlink", entries: []entry{sym("evil", outside), reg("evil/.wh.target", "")}, wantErr: "symlink component"},
		{name: "file replaces symlink, not its target", entries: []entry{sym("evil", target), reg("evil", "pwned")},
			check: func(t *testing.T, root string) { checkContent(t, root, "evil", "pwned") }},
		{name: "dir replaces symlink", entries: []entry{sym("evil", outside), dir("evil/"), reg("evil/f", "in")},
			check: func(t *testing.T, root string) { checkContent(t, root, "evil/f", "in") }},
		{name: "hard link escapes", entries: []entry{lnk("l", "../../../../etc/passwd")}, wantErr: `".." component`},
		{name: "hard link absolute", entries: []entry{lnk("l", "/etc/passwd")}, wantErr: "not in this layer"},
		{name: "hard link through symlink", entries: []entry{sym("d", outside), lnk("l", "d/target")}, wantErr: "symlink component"},
		{name: "hard link to symlink links the symlink", entries: []entry{sym("s", target), lnk("l", "s")},
			check: func(t *testing.T, root string) {
				if got, err := os.Readlink(filepath.Join(root, "l")); err != nil || got != target {
					t.Errorf("l: %q, %v", got, err)
				}
			}},
		{name: "hard link to a directory", entries: []entry{dir("d/"), lnk("l", "d")}, wantErr: "is a directory"},
		{name: "whiteout then dir is opaque", entries: []entry{reg(".wh.x", ""), dir("x/"), reg("x/f", "new")},
			check: func(t *testing.T, root string) { checkOpaque(t, root, "x"); checkContent(t, root, "x/f", "new") }},
		{name: "whiteout then implied dir is opaque", entries: []entry{reg("a/.wh.x", ""), reg("a/x/f", "new")},
			check: func(t *testing.T, root string) { checkOpaque(t, root, "a/x"); checkContent(t, root, "a/x/f", "new") }},
		{name: "whiteout of own dir keeps it, opaque", entries: []entry{dir("x/"), reg("x/f", "mine"), reg(".wh.x", "")},
			check: func(t *testing.T, root string) { checkOpaque(t, root, "x"); checkContent(t, root, "x/f", "mine") }},
		{name: "whiteout of own file keeps it", entries: []entry{reg("f", "mine"), reg(".wh.f", "")},
			check: func(t *testing.T, root string) { checkContent(t, root, "f", "mine") }},
		{name: "whiteout names nothing", entries: []entry{reg("a/.wh.", "")}, wantErr: "names no entry"},
		{name: "aufs metadata skipped", entries: []entry{reg(".wh..wh.plnk/123", "x"), reg(".wh..wh.aufs", "")},
			check: func(t *testing.T, root string) {
				if entries, _ := os.ReadDir(root); len(entries) != 0 {
					t.Errorf("aufs metadata unpacked: %v", entries)
				}
			}},
		{name: "opaque root", entries: []entry{reg(".wh..wh..opq", ""), reg("f", "only")},
			check: func(t *testing.T, root string) { checkOpaque(t, root, ".") }},
		{name: "forged overlay xattrs dropped", entries: []entry{xattrFile},
			check: func(t *testing.T, root string) {
				p := filepath.Join(root, "x")
				for _, x := range []string{"user.overlay.opaque", "trusted.overlay.redirect"} {
					if v := getXattr(t, p, x); v != "" {
						t.Errorf("%s = %q", x, v)
					}
				}
				if v := getXattr(t, p, "user.ok"); v != "kept" {
					t.Errorf("user.ok = %q", v)
				}
			}},
		{name: "setuid and setgid survive chown", entries: []entry{setuidFile},
			check: func(t *testing.T, root string) { checkMode(t, root, "bin/tool", unix.S_IFREG|0o6755, 0, 50) }},
		{name: "implied parents are root 0755", entries: []entry{reg("p/q/f", "x")},
			check: func(t *testing.T, root string) { checkMode(t, root, "p/q", unix.S_IFDIR|0o755, 0, 0) }},
		{name: "later entry replaces a directory", entries: []entry{dir("d/"), reg("d/f", "x"), reg("d", "file now")},
			check: func(t *testing.T, root string) { checkContent(t, root, "d", "file now") }},
		{name: "owner out of range", entries: []entry{badOwner}, wantErr: "out of range"},
		{name: "root as a file", entries: []entry{rootFile}, wantErr: "root must be a directory"},
		{name: "file under a file", entries: []entry{reg("f", "x"), reg("f/g", "y")}, wantErr: "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			data := entriesTar(t, tc.entries)
			root, _, err := unpackBytes(t, s, data, data)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to say %q", err, tc.wantErr)
				}
				if !errors.Is(err, errdefs.ErrInvalid) {
					t.Errorf("err = %v, want ErrInvalid", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			checkOutside(t)
			if tc.check != nil && err == nil {
				tc.check(t, root)
			}
		})
	}
}

func checkContent(t *testing.T, root, p, want string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, p), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		t.Errorf("%s: not a regular file (mode %o, %v)", p, st.Mode, err)
		return
	}
	if data, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(data) != want {
		t.Errorf("%s = %q, %v; want %q", p, data, err, want)
	}
}

func checkOpaque(t *testing.T, root, p string) {
	t.Helper()
	for _, x := range opaqueXattrs {
		if v := getXattr(t, filepath.Join(root, p), x); v != "y" {
			t.Errorf("%s: %s = %q, want y", p, x, v)
		}
	}
}

// TestUnpackLimits checks that bombs stop at their limit.
func TestUnpackLimits(t *testing.T) {
	needRoot(t)
	big := strings.Repeat("\x00", 4<<20)

	t.Run("layer size", func(t *testing.T) {
		s := openStore(t, WithLimits(Limits{MaxLayerSize: 1 << 20}))
		data := entriesTar(t, []entry{reg("big", big)})
		_, _, err := unpackBytes(t, s, data, data)
		if !errors.Is(err, errdefs.ErrTooLarge) {
			t.Errorf("err = %v, want ErrTooLarge", err)
		}
	})
	t.Run("gzip bomb", func(t *testing.T) {
		// 64 MiB of zeros compress to about 64 KiB.
		s := openStore(t, WithLimits(Limits{MaxLayerSize: 8 << 20}))
		gz, tarBuf := gzipBomb(64 << 20)
		_, _, err := unpackBytes(t, s, gz.Bytes(), tarBuf.Bytes())
		if !errors.Is(err, errdefs.ErrTooLarge) {
			t.Errorf("err = %v, want ErrTooLarge", err)
		}
		t.Logf("%d-byte blob: %v", gz.Len(), err)
	})
	t.Run("image size", func(t *testing.T) {
		s := openStore(t, WithLimits(Limits{MaxImageSize: 1 << 20}))
		data := entriesTar(t, []entry{reg("big", big)})
		_, _, err := unpackBytes(t, s, data, data)
		if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "image") {
			t.Errorf("err = %v, want ErrTooLarge for the image", err)
		}
	})
	t.Run("entries", func(t *testing.T) {
		s := openStore(t, WithLimits(Limits{MaxEntries: 10}))
		var es []entry
		for i := range 20 {
			es = append(es, reg("f"+strings.Repeat("x", i), ""))
		}
		data := entriesTar(t, es)
		_, _, err := unpackBytes(t, s, data, data)
		if !errors.Is(err, errdefs.ErrTooLarge) {
			t.Errorf("err = %v, want ErrTooLarge", err)
		}
	})
	t.Run("xattrs", func(t *testing.T) {
		s := openStore(t, WithLimits(Limits{MaxXattrSize: 100}))
		e := reg("f", "")
		e.hdr.PAXRecords = map[string]string{"SCHILY.xattr.user.big": strings.Repeat("v", 200)}
		data := entriesTar(t, []entry{e})
		_, _, err := unpackBytes(t, s, data, data)
		if !errors.Is(err, errdefs.ErrTooLarge) {
			t.Errorf("err = %v, want ErrTooLarge", err)
		}
	})
	t.Run("diff ID", func(t *testing.T) {
		s := openStore(t)
		data := entriesTar(t, []entry{reg("f", "x")})
		_, _, err := unpackBytes(t, s, data, append([]byte("other"), data...))
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "diff ID") {
			t.Errorf("err = %v, want a diff ID mismatch", err)
		}
	})
}

// TestUnpackCancelled cancels a pull in the middle of a layer: the
// half-unpacked directory goes.
func TestUnpackCancelled(t *testing.T) {
	needRoot(t)
	s := openStore(t)
	data := entriesTar(t, []entry{reg("a", strings.Repeat("a", 1<<20)), reg("b", strings.Repeat("b", 4<<20))})
	sum := sha256.Sum256(data)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := blob{diffID: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}, size: -1, open: func() (io.ReadCloser, error) {
		return io.NopCloser(&cancelAfter{r: bytes.NewReader(data), n: 2 << 20, cancel: cancel}), nil
	}}
	var left atomic.Int64
	left.Store(s.lim.MaxImageSize)
	if _, err := s.unpack(ctx, b, &left); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if d := layerDirs(t, s); len(d) != 0 {
		t.Errorf("a cancelled unpack left %v", d)
	}
}

// cancelAfter cancels a context once n bytes were read through it.
type cancelAfter struct {
	r      io.Reader
	n      int
	cancel func()
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.n -= n; c.n <= 0 {
		c.cancel()
	}
	return n, err
}

// TestOpaqueRootStack checks that a layer replacing the whole tree ends
// the image's overlay stack.
func TestOpaqueRootStack(t *testing.T) {
	s := &Store{dir: "/store", layers: map[string]*layerInfo{
		"b": {}, "o": {layerStats: layerStats{OpaqueRoot: true}}, "t": {},
	}}
	rec := &record{Layers: []recordLayer{{DiffID: "sha256:b"}, {DiffID: "sha256:o"}, {DiffID: "sha256:t"}, {DiffID: "sha256:t"}}}
	got := s.stack(rec)
	want := []string{"/store/layers/t/root", "/store/layers/o/root"}
	if strings.Join(got, ":") != strings.Join(want, ":") {
		t.Errorf("stack %v, want %v", got, want)
	}
}

// TestUnpackBadCapability: a security.capability xattr the kernel refuses
// is the image's fault: ErrInvalid naming the entry and the attribute,
// not an internal error.
func TestUnpackBadCapability(t *testing.T) {
	needRoot(t)
	s := openStore(t)
	e := reg("bin/ping", "x")
	e.hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": "not a capability"}
	data := entriesTar(t, []entry{e})
	_, _, err := unpackBytes(t, s, data, data)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "bin/ping") || !strings.Contains(err.Error(), "security.capability") {
		t.Errorf("err = %v, want ErrInvalid naming bin/ping and security.capability", err)
	}
}

// TestUnpackBombFree: a gzip bomb (64 MiB of zeros in about 64 KiB,
// made here) under the layer and image caps still stops where the store's
// file system would be left with less than MinFree: ErrNoSpace, and
// nothing of the layer stays.
func TestUnpackBombFree(t *testing.T) {
	needRoot(t)
	s := storeWithRoom(t, 8<<20)
	gz, tarBuf := gzipBomb(64 << 20)
	_, _, err := unpackBytes(t, s, gz.Bytes(), tarBuf.Bytes())
	if !errors.Is(err, errdefs.ErrNoSpace) || !strings.Contains(err.Error(), "free") {
		t.Errorf("err = %v, want ErrNoSpace", err)
	}
	t.Logf("a %d-byte blob of %d bytes: %v", gz.Len(), tarBuf.Len(), err)
}

// TestImportBombFree: a gzip-compressed archive inflates as it is spooled;
// a bomb (64 MiB of zeros in about 64 KiB) stops where the store's file
// system would keep less than MinFree, with ErrNoSpace.
func TestImportBombFree(t *testing.T) {
	needRoot(t)
	s := storeWithRoom(t, 8<<20)
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	zero := make([]byte, 1<<20)
	for range 64 {
		zw.Write(zero)
	}
	zw.Close()
	_, err := s.Import(context.Background(), &gz, "")
	if !errors.Is(err, errdefs.ErrNoSpace) {
		t.Errorf("err = %v, want ErrNoSpace", err)
	}
}

// storeWithRoom opens a store on a file system of its own (a tmpfs, so
// that no other writer on the host moves its free space) whose unpacks
// may write about room bytes before its free space reaches MinFree.
func storeWithRoom(t *testing.T, room int64) *Store {
	t.Helper()
	const minFree = 16 << 20
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", room+minFree+4<<20)); err != nil {
		t.Skipf("no tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	s, err := Open(filepath.Join(dir, "images"), testLogger(t), WithLimits(Limits{MinFree: minFree}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// gzipBomb is a layer holding one file of n zero bytes (n a multiple of
// 1 MiB), gzipped (about 1 KiB per MiB), and the tar it compresses.
func gzipBomb(n int64) (gz, tarBuf *bytes.Buffer) {
	tarBuf, gz = &bytes.Buffer{}, &bytes.Buffer{}
	tw := tar.NewWriter(tarBuf)
	tw.WriteHeader(&tar.Header{Name: "bomb", Typeflag: tar.TypeReg, Mode: 0o644, Size: n})
	zero := make([]byte, 1<<20)
	for range n >> 20 {
		tw.Write(zero)
	}
	tw.Close()
	zw, _ := gzip.NewWriterLevel(gz, gzip.BestCompression)
	zw.Write(tarBuf.Bytes())
	zw.Close()
	return gz, tarBuf
}
