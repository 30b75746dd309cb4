package guest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
)

// fileGuest serves file ops over real socket pairs, with a temporary
// directory as the sandbox's root and /workspace as its workdir.
type fileGuest struct {
	t    *testing.T
	root string
	c    *guestapi.Client
}

func startFileGuest(t *testing.T) *fileGuest {
	t.Helper()
	root := t.TempDir()
	old := fileRootDir
	fileRootDir = root
	t.Cleanup(func() { fileRootDir = old })
	for _, d := range []string{"workspace", "etc", "proc", "tmp"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fileWriteHost(t, filepath.Join(root, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1001::/home/alice:/bin/sh\n")
	fileWriteHost(t, filepath.Join(root, "etc/group"), "root:x:0:\nalice:x:1001:\nstaff:x:50:alice\n")
	s := newServer(guestapi.ServeConfig{Workdir: "/workspace"}, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var dials atomic.Int32
	c := guestapi.NewClient(pairDialer(t, &dials, s.handle))
	return &fileGuest{t: t, root: root, c: c}
}

func fileWriteHost(t *testing.T, p, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func fileCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func (g *fileGuest) host(p string) string { return filepath.Join(g.root, p) }

func (g *fileGuest) read(p string, off int64, length *int64) (string, error) {
	_, ds, err := g.c.ReadFile(fileCtx(g.t), guestapi.FileRequest{Path: p, Offset: off, Length: length})
	if err != nil {
		return "", err
	}
	defer ds.Close()
	b, err := io.ReadAll(ds)
	return string(b), err
}

func (g *fileGuest) write(p, data string, mode *api.FileMode, owner string) (*api.FileInfo, error) {
	end, err := g.c.WriteFile(fileCtx(g.t), guestapi.FileRequest{Path: p, Mode: mode, Owner: owner}, strings.NewReader(data))
	if err != nil {
		return nil, err
	}
	return end.Info, nil
}

// do makes a file op that has no stream through the client's method for
// it.
func (g *fileGuest) do(op string, fr guestapi.FileRequest) (*guestapi.FileResponse, error) {
	ctx := fileCtx(g.t)
	var info *api.FileInfo
	var err error
	switch op {
	case guestapi.OpFileStat:
		info, err = g.c.Stat(ctx, fr)
	case guestapi.OpFileMkdir:
		info, err = g.c.Mkdir(ctx, fr)
	case guestapi.OpFileMove:
		info, err = g.c.Move(ctx, fr)
	case guestapi.OpFileRemove:
		err = g.c.Remove(ctx, fr)
	default:
		g.t.Fatalf("no client method for op %q", op)
	}
	if err != nil {
		return nil, err
	}
	return &guestapi.FileResponse{Info: info}, nil
}

func (g *fileGuest) list(p string, depth int) ([]api.FileInfo, error) {
	ls, err := g.c.ListDir(fileCtx(g.t), guestapi.FileRequest{Path: p, Depth: depth})
	if err != nil {
		return nil, err
	}
	defer ls.Close()
	var all []api.FileInfo
	for {
		b, err := ls.Next()
		if err == io.EOF {
			return all, nil
		}
		if err != nil {
			return all, err
		}
		all = append(all, b...)
	}
}

func fmode(m api.FileMode) *api.FileMode { return &m }

func fi64(v int64) *int64 { return &v }

func fileLstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestFileReadWrite(t *testing.T) {
	g := startFileGuest(t)
	fi, err := g.write("/workspace/a.txt", "hello world", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Type != api.TypeFile || fi.Size != 11 || fi.Mode != 0o644 || fi.UID != 0 || fi.User != "root" {
		t.Errorf("write answered %+v", fi)
	}
	for _, tc := range []struct {
		off    int64
		length *int64
		want   string
	}{
		{0, nil, "hello world"},
		{6, nil, "world"},
		{0, fi64(5), "hello"},
		{6, fi64(100), "world"},
		{100, nil, ""},
		{3, fi64(0), ""},
	} {
		got, err := g.read("/workspace/a.txt", tc.off, tc.length)
		if err != nil || got != tc.want {
			t.Errorf("read offset %d length %v = %q, %v; want %q", tc.off, tc.length, got, err, tc.want)
		}
	}
	// A relative path is the workdir's.
	if got, err := g.read("a.txt", 0, nil); err != nil || got != "hello world" {
		t.Errorf("read of a relative path = %q, %v", got, err)
	}

	// Mode and owner, by name, by number, with a group.
	for _, tc := range []struct {
		owner    string
		uid, gid uint32
	}{
		{"alice", 1000, 1001},
		{"alice:staff", 1000, 50},
		{"1234:5678", 1234, 5678},
		{"4321", 4321, 0},
		{":staff", 0, 50},
	} {
		p := "/workspace/owned-" + strings.ReplaceAll(tc.owner, ":", "_")
		fi, err := g.write(p, "x", fmode(0o4750), tc.owner)
		if err != nil {
			t.Fatalf("write owner %q: %v", tc.owner, err)
		}
		st := fileLstat(t, g.host(p))
		if st.Uid != tc.uid || st.Gid != tc.gid || st.Mode&0o7777 != 0o4750 {
			t.Errorf("owner %q: file is %d:%d %o, want %d:%d 4750", tc.owner, st.Uid, st.Gid, st.Mode&0o7777, tc.uid, tc.gid)
		}
		if fi.UID != tc.uid || fi.Mode != 0o4750 {
			t.Errorf("owner %q: answer %+v", tc.owner, fi)
		}
	}
	// A rewrite without mode or owner keeps the file's.
	if _, err := g.write("/workspace/owned-alice", "again", nil, ""); err != nil {
		t.Fatal(err)
	}
	if st := fileLstat(t, g.host("/workspace/owned-alice")); st.Uid != 1000 || st.Mode&0o7777 != 0o4750 {
		t.Errorf("rewrite changed the owner or mode: %d %o", st.Uid, st.Mode&0o7777)
	}
	if _, err := g.write("/workspace/x", "x", nil, "mallory"); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "mallory") {
		t.Errorf("unknown owner: %v, want an invalid argument naming it", err)
	}
	// Missing parents are made.
	if _, err := g.write("/workspace/new/deep/f", "f", nil, "alice"); err != nil {
		t.Fatal(err)
	}
	if st := fileLstat(t, g.host("/workspace/new/deep")); st.Uid != 1000 || st.Mode&0o777 != 0o755 {
		t.Errorf("made parent is %d %o, want alice's 0755", st.Uid, st.Mode&0o777)
	}
}

func TestFileWriteAtomic(t *testing.T) {
	g := startFileGuest(t)
	if _, err := g.write("/workspace/f", "original", nil, ""); err != nil {
		t.Fatal(err)
	}
	// A writer that goes away part way leaves the file as it was and no
	// temporary file behind.
	c, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := g.c.WriteFile(c, guestapi.FileRequest{Path: "/workspace/f"}, pr)
		done <- err
	}()
	pw.Write(bytes.Repeat([]byte("n"), 3<<20))
	cancel()
	pw.CloseWithError(errors.New("gone"))
	if err := <-done; err == nil {
		t.Fatal("an interrupted write succeeded")
	}
	waitNoTemp(t, g.host("/workspace"))
	if got, _ := os.ReadFile(g.host("/workspace/f")); string(got) != "original" {
		t.Errorf("after an interrupted write the file holds %q", got)
	}
	// A source that fails is a SourceError, and changes nothing either.
	_, err := g.c.WriteFile(fileCtx(t), guestapi.FileRequest{Path: "/workspace/f"}, io.MultiReader(strings.NewReader("xx"), fileErrReader{}))
	var se *guestapi.SourceError
	if !errors.As(err, &se) {
		t.Errorf("failing source: %v, want a SourceError", err)
	}
	waitNoTemp(t, g.host("/workspace"))
	if got, _ := os.ReadFile(g.host("/workspace/f")); string(got) != "original" {
		t.Errorf("after a failed source the file holds %q", got)
	}
}

type fileErrReader struct{}

func (fileErrReader) Read([]byte) (int, error) { return 0, errors.New("source broke") }

func waitNoTemp(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, _ := filepath.Glob(filepath.Join(dir, ".paddock-*"))
		if len(m) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("temporary files left: %v", m)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestFileErrors(t *testing.T) {
	g := startFileGuest(t)
	os.MkdirAll(g.host("/workspace/dir/sub"), 0o755)
	fileWriteHost(t, g.host("/workspace/file"), "f")
	if err := unix.Mkfifo(g.host("/workspace/fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		do   func() error
		cat  error
		says string
	}{
		{"read missing", func() error { _, err := g.read("/workspace/nope", 0, nil); return err }, errdefs.ErrNotFound, "/workspace/nope"},
		{"read dir", func() error { _, err := g.read("/workspace/dir", 0, nil); return err }, errdefs.ErrConflict, "is a directory"},
		{"read fifo", func() error { _, err := g.read("/workspace/fifo", 0, nil); return err }, errdefs.ErrInvalid, "not a regular file"},
		{"read negative offset", func() error { _, err := g.read("/workspace/file", -1, nil); return err }, errdefs.ErrInvalid, "offset"},
		{"read under a file", func() error { _, err := g.read("/workspace/file/x", 0, nil); return err }, errdefs.ErrConflict, "not a directory"},
		{"empty path", func() error { _, err := g.read("", 0, nil); return err }, errdefs.ErrInvalid, "path"},
		{"write onto dir", func() error { _, err := g.write("/workspace/dir", "x", nil, ""); return err }, errdefs.ErrConflict, "is a directory"},
		{"write /", func() error { _, err := g.write("/", "x", nil, ""); return err }, errdefs.ErrConflict, "is a directory"},
		{"stat missing", func() error { _, err := g.do(guestapi.OpFileStat, guestapi.FileRequest{Path: "/nope"}); return err }, errdefs.ErrNotFound, "/nope"},
		{"mkdir existing", func() error {
			_, err := g.do(guestapi.OpFileMkdir, guestapi.FileRequest{Path: "/workspace/dir"})
			return err
		}, errdefs.ErrConflict, "exists"},
		{"mkdir -p over a file", func() error {
			_, err := g.do(guestapi.OpFileMkdir, guestapi.FileRequest{Path: "/workspace/file", Parents: true})
			return err
		}, errdefs.ErrConflict, "not a directory"},
		{"mkdir without parent", func() error {
			_, err := g.do(guestapi.OpFileMkdir, guestapi.FileRequest{Path: "/workspace/a/b"})
			return err
		}, errdefs.ErrNotFound, "/workspace/a"},
		{"remove missing", func() error {
			_, err := g.do(guestapi.OpFileRemove, guestapi.FileRequest{Path: "/workspace/nope"})
			return err
		}, errdefs.ErrNotFound, "/workspace/nope"},
		{"remove non-empty", func() error {
			_, err := g.do(guestapi.OpFileRemove, guestapi.FileRequest{Path: "/workspace/dir"})
			return err
		}, errdefs.ErrConflict, "not empty"},
		{"remove /", func() error {
			_, err := g.do(guestapi.OpFileRemove, guestapi.FileRequest{Path: "/", Recursive: true})
			return err
		}, errdefs.ErrInvalid, "/"},
		{"move missing", func() error {
			_, err := g.do(guestapi.OpFileMove, guestapi.FileRequest{Path: "/workspace/nope", To: "/workspace/x"})
			return err
		}, errdefs.ErrNotFound, "/workspace/nope"},
		{"move onto existing", func() error {
			_, err := g.do(guestapi.OpFileMove, guestapi.FileRequest{Path: "/workspace/file", To: "/workspace/fifo"})
			return err
		}, errdefs.ErrConflict, "already exists"},
		{"move into itself", func() error {
			_, err := g.do(guestapi.OpFileMove, guestapi.FileRequest{Path: "/workspace/dir", To: "/workspace/dir/sub/x"})
			return err
		}, errdefs.ErrInvalid, "into itself"},
		{"move onto non-empty dir", func() error {
			os.MkdirAll(g.host("/workspace/d2"), 0o755)
			_, err := g.do(guestapi.OpFileMove, guestapi.FileRequest{Path: "/workspace/d2", To: "/workspace/dir", Overwrite: true})
			return err
		}, errdefs.ErrConflict, "not empty"},
		{"list a file", func() error { _, err := g.list("/workspace/file", 1); return err }, errdefs.ErrConflict, "not a directory"},
		{"list missing", func() error { _, err := g.list("/workspace/nope", 1); return err }, errdefs.ErrNotFound, "/workspace/nope"},
		{"bad mode", func() error { _, err := api.ParseFileMode("0999"); return errdefs.Invalid("mode", "%v", err) }, errdefs.ErrInvalid, "0999"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if !errors.Is(err, tc.cat) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("got %v, want %v naming %q", err, tc.cat, tc.says)
			}
		})
	}
}

func TestFileListStatMkdirRemoveMove(t *testing.T) {
	g := startFileGuest(t)
	os.MkdirAll(g.host("/workspace/p/b/c"), 0o755)
	fileWriteHost(t, g.host("/workspace/p/a.txt"), "aaa")
	fileWriteHost(t, g.host("/workspace/p/b/c/deep.txt"), "d")
	os.Symlink("/etc/passwd", g.host("/workspace/p/link"))
	os.Chown(g.host("/workspace/p/a.txt"), 1000, 50)

	names := func(fis []api.FileInfo) []string {
		var out []string
		for _, fi := range fis {
			out = append(out, fi.Path)
		}
		return out
	}
	fis, err := g.list("/workspace/p", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(names(fis), " "), "/workspace/p/a.txt /workspace/p/b /workspace/p/link"; got != want {
		t.Errorf("list depth 1 = %s, want %s", got, want)
	}
	for _, fi := range fis {
		switch fi.Name {
		case "a.txt":
			if fi.Type != api.TypeFile || fi.Size != 3 || fi.User != "alice" || fi.Group != "staff" || fi.UID != 1000 || fi.ModTime.IsZero() {
				t.Errorf("a.txt: %+v", fi)
			}
		case "b":
			if fi.Type != api.TypeDir {
				t.Errorf("b: %+v", fi)
			}
		case "link":
			if fi.Type != api.TypeSymlink || fi.LinkTarget != "/etc/passwd" {
				t.Errorf("link: %+v", fi)
			}
		}
	}
	fis, err = g.list("/workspace/p", 3)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(names(fis), " "), "/workspace/p/a.txt /workspace/p/b /workspace/p/b/c /workspace/p/b/c/deep.txt /workspace/p/link"; got != want {
		t.Errorf("list depth 3 = %s, want %s", got, want)
	}
	// Many entries come in several batches, in order.
	os.Mkdir(g.host("/workspace/many"), 0o755)
	for i := 0; i < 600; i++ {
		fileWriteHost(t, g.host("/workspace/many/"+strings.Repeat("x", i%7)+hex.EncodeToString([]byte{byte(i >> 8), byte(i)})), "")
	}
	fis, err = g.list("/workspace/many", 1)
	if err != nil || len(fis) != 600 || !sort.SliceIsSorted(fis, func(i, j int) bool { return fis[i].Name < fis[j].Name }) {
		t.Errorf("list of 600 entries: %d entries, sorted %v, %v", len(fis), sort.SliceIsSorted(fis, func(i, j int) bool { return fis[i].Name < fis[j].Name }), err)
	}

	// stat describes a link as a link.
	r, err := g.do(guestapi.OpFileStat, guestapi.FileRequest{Path: "/workspace/p/link"})
	if err != nil || r.Info.Type != api.TypeSymlink || r.Info.LinkTarget != "/etc/passwd" {
		t.Errorf("stat link = %+v, %v", r, err)
	}
	if r, err := g.do(guestapi.OpFileStat, guestapi.FileRequest{Path: "/"}); err != nil || r.Info.Type != api.TypeDir || r.Info.Name != "/" {
		t.Errorf("stat / = %+v, %v", r, err)
	}

	// mkdir, mkdir -p with mode and owner.
	r, err = g.do(guestapi.OpFileMkdir, guestapi.FileRequest{Path: "/workspace/m", Mode: fmode(0o700), Owner: "alice"})
	if err != nil || r.Info.Type != api.TypeDir || r.Info.Mode != 0o700 || r.Info.UID != 1000 {
		t.Errorf("mkdir = %+v, %v", r, err)
	}
	if _, err := g.do(guestapi.OpFileMkdir, guestapi.FileRequest{Path: "/workspace/m/x/y/z", Parents: true, Mode: fmode(0o750)}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"x", "x/y", "x/y/z"} {
		if st := fileLstat(t, g.host("/workspace/m/"+d)); st.Mode&0o7777 != 0o750 {
			t.Errorf("mkdir -p made %s %o, want 0750", d, st.Mode&0o7777)
		}
	}
	if st := fileLstat(t, g.host("/workspace/m")); st.Mode&0o7777 != 0o700 {
		t.Errorf("mkdir -p changed an existing parent to %o", st.Mode&0o7777)
	}
	if _, err := g.do(guestapi.OpFileMkdir, guestapi.FileRequest{Path: "/workspace/m/x", Parents: true}); err != nil {
		t.Errorf("mkdir -p of an existing directory: %v", err)
	}

	// move, with and without overwrite.
	fileWriteHost(t, g.host("/workspace/m1"), "one")
	fileWriteHost(t, g.host("/workspace/m2"), "two")
	if _, err := g.do(guestapi.OpFileMove, guestapi.FileRequest{Path: "/workspace/m1", To: "/workspace/m2", Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(g.host("/workspace/m2")); string(b) != "one" {
		t.Errorf("after move m2 holds %q", b)
	}
	if r, err := g.do(guestapi.OpFileMove, guestapi.FileRequest{Path: "/workspace/p", To: "/workspace/q"}); err != nil || r.Info.Type != api.TypeDir || r.Info.Path != "/workspace/q" {
		t.Errorf("move dir = %+v, %v", r, err)
	}

	// remove: a file, an empty dir, a tree.
	for _, p := range []string{"/workspace/m2", "/workspace/m/x/y/z"} {
		if _, err := g.do(guestapi.OpFileRemove, guestapi.FileRequest{Path: p}); err != nil {
			t.Errorf("remove %s: %v", p, err)
		}
	}
	if _, err := g.do(guestapi.OpFileRemove, guestapi.FileRequest{Path: "/workspace/q", Recursive: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(g.host("/workspace/q")); !os.IsNotExist(err) {
		t.Errorf("recursive remove left %v", err)
	}
	if _, err := os.Stat(g.host("/etc/passwd")); err != nil {
		t.Errorf("recursive remove of a tree with a link to /etc/passwd removed it: %v", err)
	}
}

func fileSHA(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestFileTarRoundTrip(t *testing.T) {
	g := startFileGuest(t)
	src := g.host("/workspace/src")
	os.MkdirAll(filepath.Join(src, "d/e"), 0o750)
	fileWriteHost(t, filepath.Join(src, "a.txt"), "alpha")
	fileWriteHost(t, filepath.Join(src, "d/e/b.bin"), strings.Repeat("b", 3<<20))
	os.Chown(filepath.Join(src, "a.txt"), 1000, 1001)
	unix.Chmod(filepath.Join(src, "a.txt"), 0o4755)
	os.Symlink("../a.txt", filepath.Join(src, "d/rel"))
	os.Symlink("/etc/passwd", filepath.Join(src, "abs"))
	os.Link(filepath.Join(src, "a.txt"), filepath.Join(src, "d/hard"))
	unix.Mkfifo(filepath.Join(src, "fifo"), 0o600)
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	os.Chtimes(filepath.Join(src, "a.txt"), mtime, mtime)

	ds, err := g.c.TarGet(fileCtx(t), guestapi.FileRequest{Path: "/workspace/src"})
	if err != nil {
		t.Fatal(err)
	}
	var tarball bytes.Buffer
	if _, err := io.Copy(&tarball, ds); err != nil {
		t.Fatal(err)
	}
	ds.Close()
	end, err := g.c.TarPut(fileCtx(t), guestapi.FileRequest{Path: "/workspace/dst"}, bytes.NewReader(tarball.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if end.Entries < 8 || end.Bytes != int64(tarball.Len()) {
		t.Errorf("upload answered %+v for a %d-byte tar", end, tarball.Len())
	}
	dst := g.host("/workspace/dst/src")
	if fileSHA(t, filepath.Join(dst, "d/e/b.bin")) != fileSHA(t, filepath.Join(src, "d/e/b.bin")) {
		t.Error("b.bin differs after the round trip")
	}
	st := fileLstat(t, filepath.Join(dst, "a.txt"))
	if st.Mode&0o7777 != 0o4755 || st.Uid != 1000 || st.Gid != 1001 || st.Mtim.Sec != mtime.Unix() {
		t.Errorf("a.txt is %o %d:%d mtime %d", st.Mode&0o7777, st.Uid, st.Gid, st.Mtim.Sec)
	}
	if st := fileLstat(t, filepath.Join(dst, "d/e")); st.Mode&0o7777 != 0o750 {
		t.Errorf("d/e is %o", st.Mode&0o7777)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "d/rel")); l != "../a.txt" {
		t.Errorf("d/rel -> %q", l)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "abs")); l != "/etc/passwd" {
		t.Errorf("abs -> %q", l)
	}
	if a, h := fileLstat(t, filepath.Join(dst, "a.txt")), fileLstat(t, filepath.Join(dst, "d/hard")); a.Ino != h.Ino {
		t.Error("d/hard is not a hard link of a.txt")
	}
	if st := fileLstat(t, filepath.Join(dst, "fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("fifo is %o", st.Mode)
	}

	// A single file downloads as one entry named after it; an owner
	// given to the upload wins over the tar's.
	ds, err = g.c.TarGet(fileCtx(t), guestapi.FileRequest{Path: "/workspace/src/a.txt"})
	if err != nil {
		t.Fatal(err)
	}
	tarball.Reset()
	io.Copy(&tarball, ds)
	ds.Close()
	if _, err := g.c.TarPut(fileCtx(t), guestapi.FileRequest{Path: "/workspace/one", Owner: "0:50"}, &tarball); err != nil {
		t.Fatal(err)
	}
	if st := fileLstat(t, g.host("/workspace/one/a.txt")); st.Uid != 0 || st.Gid != 50 {
		t.Errorf("owner override: a.txt is %d:%d", st.Uid, st.Gid)
	}
	// Garbage is refused.
	if _, err := g.c.TarPut(fileCtx(t), guestapi.FileRequest{Path: "/workspace/g"}, strings.NewReader(strings.Repeat("garbage!", 200))); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("garbage tar: %v", err)
	}
}
