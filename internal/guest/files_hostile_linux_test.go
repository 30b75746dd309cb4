package guest

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/untar"
)

// hostSentinels records host files that no file op may touch, and checks
// them at the end of the test.
func hostSentinels(t *testing.T) (outside string) {
	t.Helper()
	outside = t.TempDir()
	fileWriteHost(t, filepath.Join(outside, "secret"), "host secret")
	shadow := ""
	if _, err := os.Stat("/etc/shadow"); err == nil {
		shadow = fileSHA(t, "/etc/shadow")
	}
	t.Cleanup(func() {
		if shadow != "" && fileSHA(t, "/etc/shadow") != shadow {
			t.Error("the host's /etc/shadow changed")
		}
		if b, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(b) != "host secret" {
			t.Errorf("the host's secret file changed: %q, %v", b, err)
		}
		entries, _ := os.ReadDir(outside)
		if len(entries) != 1 {
			t.Errorf("files appeared beside the host's secret: %v", entries)
		}
		for _, p := range []string{"/etc/evil", "/etc/written", "/tmp/evil", "/written"} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s appeared on the host", p)
			}
		}
	})
	return outside
}

// fileMountProc mounts a procfs at dir (the test's own, so /proc/1 is the
// host's init), for the magic-link cases; it skips them without root.
func fileMountProc(t *testing.T, dir string) bool {
	t.Helper()
	if err := unix.Mount("proc", dir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Logf("no procfs in the test root (%v): skipping the /proc cases", err)
		return false
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return true
}

// TestFileHostilePaths runs every file op through links a hostile sandbox
// would plant. Each must land inside the root or be refused with an error
// naming the path; nothing outside the root may change.
func TestFileHostilePaths(t *testing.T) {
	g := startFileGuest(t)
	outside := hostSentinels(t)
	haveProc := fileMountProc(t, g.host("/proc"))
	fileWriteHost(t, g.host("/etc/shadow"), "sandbox shadow")
	fileWriteHost(t, g.host("/workspace/file"), "file")
	links := map[string]string{
		"shadow-link": "/etc/shadow",
		"up":          "../../..",
		"deepup":      "../../../../../../../../../..",
		"etc-link":    "/etc",
		"proc-root":   "/proc/1/root",
		"self-root":   "/proc/self/root",
		"self-fd":     "/proc/self/fd/0",
		"cwd-link":    "/proc/1/cwd",
		"host-secret": filepath.Join(outside, "secret"),
		"host-dir":    outside,
	}
	plant := func() {
		for name, target := range links {
			os.Remove(g.host("/workspace/" + name))
			if err := os.Symlink(target, g.host("/workspace/"+name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	plant()
	read := func(p string) func() (string, error) {
		return func() (string, error) { return g.read(p, 0, nil) }
	}
	write := func(p string) func() (string, error) {
		return func() (string, error) { _, err := g.write(p, "written", nil, ""); return "", err }
	}
	op := func(op string, fr guestapi.FileRequest) func() (string, error) {
		return func() (string, error) { _, err := g.do(op, fr); return "", err }
	}
	list := func(p string) func() (string, error) {
		return func() (string, error) {
			fis, err := g.list(p, 1)
			var names []string
			for _, fi := range fis {
				names = append(names, fi.Name)
			}
			return strings.Join(names, " "), err
		}
	}
	watch := func(p string) func() (string, error) {
		return func() (string, error) {
			es, err := g.c.Watch(fileCtx(t), guestapi.FileRequest{Path: p})
			if err == nil {
				es.Close()
			}
			return "", err
		}
	}
	tarNames := func(p string) func() (string, error) {
		return func() (string, error) {
			ds, err := g.c.TarGet(fileCtx(t), guestapi.FileRequest{Path: p})
			if err != nil {
				return "", err
			}
			defer ds.Close()
			tr := tar.NewReader(ds)
			var out []string
			for {
				h, err := tr.Next()
				if err == io.EOF {
					return strings.Join(out, " "), nil
				}
				if err != nil {
					return "", err
				}
				b, _ := io.ReadAll(tr)
				if strings.Contains(string(b), "host secret") {
					return "", errors.New("the tar carries host data in " + h.Name)
				}
				out = append(out, h.Name)
			}
		}
	}
	const denied, notFound, invalid, conflict = "denied", "not found", "invalid", "conflict"
	for _, tc := range []struct {
		name string
		proc bool // needs the procfs mount
		do   func() (string, error)
		// want is the output, or the error kind ("denied", ...), and
		// says what the error must name.
		want, says string
		before     func()
		check      func(t *testing.T)
	}{
		{name: "read through absolute link", do: read("/workspace/shadow-link"), want: "sandbox shadow"},
		{name: "read through ../../..", do: read("/workspace/up/etc/shadow"), want: "sandbox shadow"},
		{name: "read through many ..", do: read("/workspace/deepup/etc/shadow"), want: "sandbox shadow"},
		{name: "read of a .. path", do: read("/../../../etc/shadow"), want: "sandbox shadow"},
		{name: "read of a relative .. path", do: read("../../../../etc/shadow"), want: "sandbox shadow"},
		{name: "read through link to host path", do: read("/workspace/host-secret"), want: notFound, says: "/workspace/host-secret"},
		{name: "read through link to host dir", do: read("/workspace/host-dir/secret"), want: notFound, says: "/workspace/host-dir/secret"},
		{name: "read via /proc/1/root link", proc: true, do: read("/workspace/proc-root/etc/shadow"), want: denied, says: "/workspace/proc-root/etc/shadow"},
		{name: "read via /proc/self/root link", proc: true, do: read("/workspace/self-root/etc/shadow"), want: denied, says: "self-root"},
		{name: "read via /proc/self/fd link", proc: true, do: read("/workspace/self-fd"), want: denied, says: "self-fd"},
		{name: "read via /proc/1/cwd link", proc: true, do: read("/workspace/cwd-link/etc/shadow"), want: denied, says: "cwd-link"},
		{name: "read /proc/1/root directly", proc: true, do: read("/proc/1/root/etc/shadow"), want: denied, says: "/proc/1/root"},
		{name: "read /proc/self/environ", proc: true, do: read("/proc/self/environ"), want: denied, says: "/proc/self/environ"},
		{name: "read /proc/self/mem", proc: true, do: read("/proc/self/mem"), want: denied, says: "/proc/self/mem"},
		{name: "write over absolute link", do: write("/workspace/shadow-link"), check: func(t *testing.T) {
			if b, _ := os.ReadFile(g.host("/etc/shadow")); string(b) != "sandbox shadow" {
				t.Errorf("the sandbox's /etc/shadow was written through the link: %q", b)
			}
			if st := fileLstat(t, g.host("/workspace/shadow-link")); st.Mode&unix.S_IFMT != unix.S_IFREG {
				t.Error("the link was not replaced by the file")
			}
		}},
		{name: "write through parent link to /etc", do: write("/workspace/etc-link/written"), check: func(t *testing.T) {
			if b, _ := os.ReadFile(g.host("/etc/written")); string(b) != "written" {
				t.Errorf("the write did not land in the sandbox's /etc: %q", b)
			}
		}},
		{name: "write through ../../..", do: write("/workspace/up/written"), check: func(t *testing.T) {
			if b, _ := os.ReadFile(g.host("/written")); string(b) != "written" {
				t.Errorf("the write did not land at the sandbox's root: %q", b)
			}
		}},
		{name: "write through dangling link to host dir", do: write("/workspace/host-dir/evil"), want: conflict, says: "/workspace/host-dir"},
		{name: "write through link to host dir", before: func() { os.MkdirAll(g.host(outside), 0o755) }, do: write("/workspace/host-dir/evil"), check: func(t *testing.T) {
			if b, _ := os.ReadFile(g.host(outside + "/evil")); string(b) != "written" {
				t.Errorf("the write did not land inside the root: %q", b)
			}
		}},
		{name: "write via /proc/1/root", proc: true, do: write("/workspace/proc-root/tmp/evil"), want: denied, says: "/workspace/proc-root/tmp"},
		{name: "write into /proc/self", proc: true, do: write("/proc/self/evil"), want: denied, says: "/proc/self"},
		{name: "mkdir -p through ../../..", do: op(guestapi.OpFileMkdir, guestapi.FileRequest{Path: "/workspace/up/newdir", Parents: true}), check: func(t *testing.T) {
			if _, err := os.Stat(g.host("/newdir")); err != nil {
				t.Errorf("mkdir did not land at the sandbox's root: %v", err)
			}
		}},
		{name: "mkdir -p via /proc/1/root", proc: true, do: op(guestapi.OpFileMkdir, guestapi.FileRequest{Path: "/workspace/proc-root/tmp/evil", Parents: true}), want: denied, says: "proc-root"},
		{name: "stat a magic link", proc: true, do: func() (string, error) {
			r, err := g.do(guestapi.OpFileStat, guestapi.FileRequest{Path: "/workspace/proc-root"})
			if err != nil {
				return "", err
			}
			return r.Info.Type + " " + r.Info.LinkTarget, nil
		}, want: "symlink /proc/1/root"},
		{name: "stat through a magic link", proc: true, do: op(guestapi.OpFileStat, guestapi.FileRequest{Path: "/workspace/proc-root/etc"}), want: denied, says: "proc-root"},
		{name: "list through ../../..", do: list("/workspace/up"), check: func(t *testing.T) {}},
		{name: "list /proc", proc: true, do: list("/proc"), want: denied, says: "/proc"},
		{name: "list via /proc/1/root", proc: true, do: list("/workspace/proc-root"), want: denied, says: "proc-root"},
		{name: "move a link", do: op(guestapi.OpFileMove, guestapi.FileRequest{Path: "/workspace/shadow-link", To: "/workspace/moved"}), check: func(t *testing.T) {
			if l, err := os.Readlink(g.host("/workspace/moved")); err != nil || l != "/etc/shadow" {
				t.Errorf("moved: %q %v", l, err)
			}
		}},
		{name: "move into /proc/1/root", proc: true, do: op(guestapi.OpFileMove, guestapi.FileRequest{Path: "/workspace/file", To: "/workspace/proc-root/tmp/evil"}), want: denied, says: "proc-root"},
		{name: "move out of /proc", proc: true, do: op(guestapi.OpFileMove, guestapi.FileRequest{Path: "/proc/self/environ", To: "/workspace/env"}), want: denied, says: "/proc/self"},
		{name: "remove -r of a link to ../../..", do: op(guestapi.OpFileRemove, guestapi.FileRequest{Path: "/workspace/up", Recursive: true}), check: func(t *testing.T) {
			if _, err := os.Stat(g.host("/etc/shadow")); err != nil {
				t.Errorf("remove -r followed the link: %v", err)
			}
			if _, err := os.Lstat(g.host("/workspace/up")); !os.IsNotExist(err) {
				t.Error("the link is still there")
			}
		}},
		{name: "remove -r through a link to the host", do: op(guestapi.OpFileRemove, guestapi.FileRequest{Path: "/workspace/host-dir/secret", Recursive: true}), want: notFound, says: "host-dir"},
		{name: "remove in /proc", proc: true, do: op(guestapi.OpFileRemove, guestapi.FileRequest{Path: "/proc/self/fd/0"}), want: denied, says: "/proc/self/fd"},
		{name: "tar of a tree of hostile links", do: tarNames("/workspace"), check: func(t *testing.T) {}},
		{name: "tar of / skips /proc", proc: true, do: func() (string, error) {
			names, err := tarNames("/")()
			if strings.Contains(names, "./proc/1") {
				return "", errors.New("the tar entered /proc")
			}
			return "", err
		}, want: ""},
		{name: "tar via /proc/1/root", proc: true, do: tarNames("/workspace/proc-root/etc"), want: denied, says: "proc-root"},
		{name: "watch via /proc/1/root", proc: true, do: watch("/workspace/proc-root/etc"), want: denied, says: "proc-root"},
		{name: "watch /proc", proc: true, do: watch("/proc/self"), want: denied, says: "/proc/self"},
		{name: "upload through a link to the host", before: func() { os.MkdirAll(g.host(outside), 0o755) }, do: func() (string, error) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			tw.WriteHeader(&tar.Header{Name: "evil", Typeflag: tar.TypeReg, Size: 4, Mode: 0o644})
			tw.Write([]byte("evil"))
			tw.Close()
			_, err := g.c.TarPut(fileCtx(t), guestapi.FileRequest{Path: "/workspace/host-dir"}, &buf)
			return "", err
		}, check: func(t *testing.T) {
			if _, err := os.Stat(g.host(outside + "/evil")); err != nil {
				t.Errorf("the upload did not land inside the root: %v", err)
			}
		}},
		{name: "upload into /proc", proc: true, do: func() (string, error) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			tw.WriteHeader(&tar.Header{Name: "proc/", Typeflag: tar.TypeDir, Mode: 0o755})
			tw.WriteHeader(&tar.Header{Name: "proc/self/evil", Typeflag: tar.TypeReg, Size: 4, Mode: 0o644})
			tw.Write([]byte("evil"))
			tw.Close()
			_, err := g.c.TarPut(fileCtx(t), guestapi.FileRequest{Path: "/"}, &buf)
			return "", err
		}, want: denied, says: "proc/self/evil"},
		{name: "upload with ..", do: func() (string, error) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			tw.WriteHeader(&tar.Header{Name: "../../../../../../../../tmp/evil", Typeflag: tar.TypeReg, Size: 4, Mode: 0o644})
			tw.Write([]byte("evil"))
			tw.Close()
			_, err := g.c.TarPut(fileCtx(t), guestapi.FileRequest{Path: "/workspace/x"}, &buf)
			return "", err
		}, want: invalid, says: "../../../../../../../../tmp/evil"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.proc && !haveProc {
				t.Skip("needs procfs")
			}
			plant()
			if tc.before != nil {
				tc.before()
			}
			out, err := tc.do()
			var kind error
			switch tc.want {
			case denied:
				kind = errdefs.ErrDenied
			case notFound:
				kind = errdefs.ErrNotFound
			case invalid:
				kind = errdefs.ErrInvalid
			case conflict:
				kind = errdefs.ErrConflict
			}
			switch {
			case kind != nil:
				if !errors.Is(err, kind) || !strings.Contains(err.Error(), tc.says) {
					t.Errorf("got %q, %v; want %s naming %q", out, err, tc.want, tc.says)
				}
			case err != nil:
				t.Errorf("failed: %v", err)
			case tc.check == nil && out != tc.want:
				t.Errorf("got %q, want %q", out, tc.want)
			}
			if tc.check != nil {
				tc.check(t)
			}
		})
	}
}

// fileTarEntry is one entry of a test archive.
type fileTarEntry struct {
	name, link string
	typ        byte
	body       string
	mode       int64
}

func fileTar(t *testing.T, entries ...fileTarEntry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode, Size: int64(len(e.body)), ModTime: time.Unix(1e9, 0)}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return &buf
}

// TestExtractTarHostile feeds untar.ExtractTar the archives a hostile sandbox
// or client would craft. Each entry must land inside the destination or
// be refused with an error naming it; nothing outside may change.
func TestExtractTarHostile(t *testing.T) {
	outside := hostSentinels(t)
	reg := func(name, body string) fileTarEntry { return fileTarEntry{name: name, typ: tar.TypeReg, body: body} }
	sym := func(name, target string) fileTarEntry {
		return fileTarEntry{name: name, typ: tar.TypeSymlink, link: target}
	}
	hard := func(name, target string) fileTarEntry {
		return fileTarEntry{name: name, typ: tar.TypeLink, link: target}
	}
	dir := func(name string) fileTarEntry { return fileTarEntry{name: name, typ: tar.TypeDir, mode: 0o755} }
	for _, tc := range []struct {
		name    string
		before  func(dest string) // what the sandbox planted in the destination
		entries []fileTarEntry
		opts    untar.ExtractOptions
		refused string // the entry the error must name
		check   func(t *testing.T, dest string)
	}{
		{name: "dot-dot", entries: []fileTarEntry{reg("../evil", "x")}, refused: "../evil"},
		{name: "nested dot-dot", entries: []fileTarEntry{reg("a/../../evil", "x")}, refused: "a/../../evil"},
		{name: "absolute dot-dot", entries: []fileTarEntry{reg("/../evil", "x")}, refused: "/../evil"},
		{name: "absolute name lands inside", entries: []fileTarEntry{reg("/etc/evil", "x")}, check: func(t *testing.T, dest string) {
			if b, _ := os.ReadFile(filepath.Join(dest, "etc/evil")); string(b) != "x" {
				t.Errorf("etc/evil holds %q", b)
			}
		}},
		{name: "absolute symlink then a file through it", entries: []fileTarEntry{sym("l", "/etc"), reg("l/evil", "x")}, refused: "l/evil"},
		{name: "absolute symlink to the host then a file", entries: []fileTarEntry{sym("l", outside), reg("l/evil", "x")}, refused: "l/evil"},
		{name: "relative symlink out then a file", entries: []fileTarEntry{sym("l", "../../../../../../../../tmp"), reg("l/evil", "x")}, refused: "l/evil"},
		{name: "symlink out then a directory", entries: []fileTarEntry{sym("l", "/tmp"), dir("l/evil/")}, refused: "l/evil"},
		{name: "symlink chain out", entries: []fileTarEntry{sym("a", "b"), sym("b", "/etc"), reg("a/evil", "x")}, refused: "a/evil"},
		{name: "magic link then a file", entries: []fileTarEntry{sym("m", "/proc/self/root"), reg("m/tmp/evil", "x")}, refused: "m/tmp/evil"},
		{name: "symlink to the host stays a link", entries: []fileTarEntry{sym("l", outside+"/secret")}, check: func(t *testing.T, dest string) {
			if l, _ := os.Readlink(filepath.Join(dest, "l")); l != outside+"/secret" {
				t.Errorf("l -> %q", l)
			}
		}},
		{name: "symlink inside then a file through it", entries: []fileTarEntry{dir("real/"), sym("ok", "real"), reg("ok/file", "in")}, check: func(t *testing.T, dest string) {
			if b, _ := os.ReadFile(filepath.Join(dest, "real/file")); string(b) != "in" {
				t.Errorf("real/file holds %q", b)
			}
		}},
		{name: "hard link to an absolute host file", entries: []fileTarEntry{hard("h", "/etc/passwd")}, refused: "h"},
		{name: "hard link with dot-dot", entries: []fileTarEntry{hard("h", "../secret")}, refused: "h"},
		{name: "hard link through a symlink out", entries: []fileTarEntry{sym("s", outside), hard("h", "s/secret")}, refused: "h"},
		{name: "hard link to the host file via its absolute path", entries: []fileTarEntry{hard("h", outside+"/secret")}, refused: "h"},
		{name: "hard link inside", entries: []fileTarEntry{reg("f", "data"), hard("h", "f")}, check: func(t *testing.T, dest string) {
			if a, b := fileLstat(t, filepath.Join(dest, "f")), fileLstat(t, filepath.Join(dest, "h")); a.Ino != b.Ino {
				t.Error("h is not f")
			}
		}},
		{name: "hard link to its own name", entries: []fileTarEntry{reg("f", "data"), hard("f", "f")}, check: func(t *testing.T, dest string) {
			if m, _ := filepath.Glob(filepath.Join(dest, ".paddock-*")); len(m) != 0 {
				t.Errorf("temporary names left: %v", m)
			}
		}},
		{name: "hard link to a symlink links the symlink", entries: []fileTarEntry{sym("sl", outside+"/secret"), hard("hl", "sl")}, check: func(t *testing.T, dest string) {
			if st := fileLstat(t, filepath.Join(dest, "hl")); st.Mode&unix.S_IFMT != unix.S_IFLNK {
				t.Errorf("hl is %o, want a symlink", st.Mode)
			}
		}},
		{name: "planted symlink out then a file", before: func(dest string) { os.Symlink(outside, filepath.Join(dest, "pre")) }, entries: []fileTarEntry{reg("pre/evil", "x")}, refused: "pre/evil"},
		{name: "file over a planted symlink replaces it", before: func(dest string) { os.Symlink(outside+"/secret", filepath.Join(dest, "victim")) }, entries: []fileTarEntry{reg("victim", "mine")}, check: func(t *testing.T, dest string) {
			if st := fileLstat(t, filepath.Join(dest, "victim")); st.Mode&unix.S_IFMT != unix.S_IFREG {
				t.Error("victim is still a link")
			}
		}},
		{name: "directory over a planted symlink replaces it", before: func(dest string) { os.Symlink(outside, filepath.Join(dest, "vdir")) }, entries: []fileTarEntry{dir("vdir/"), reg("vdir/f", "in")}, check: func(t *testing.T, dest string) {
			if st := fileLstat(t, filepath.Join(dest, "vdir")); st.Mode&unix.S_IFMT != unix.S_IFDIR {
				t.Error("vdir is still a link")
			}
		}},
		{name: "devices are skipped", entries: []fileTarEntry{{name: "null", typ: tar.TypeChar}, {name: "sda", typ: tar.TypeBlock}}, check: func(t *testing.T, dest string) {
			for _, n := range []string{"null", "sda"} {
				if _, err := os.Lstat(filepath.Join(dest, n)); !os.IsNotExist(err) {
					t.Errorf("%s was made", n)
				}
			}
		}},
		{name: "set-id bits dropped on request", entries: []fileTarEntry{{name: "suid", typ: tar.TypeReg, mode: 0o6755}}, check: func(t *testing.T, dest string) {
			if st := fileLstat(t, filepath.Join(dest, "suid")); st.Mode&0o7777 != 0o755 {
				t.Errorf("suid is %o", st.Mode&0o7777)
			}
		}},
		{name: "renamed names are checked too", opts: untar.ExtractOptions{UID: -1, GID: -1, Rename: func(n string) string { return "../" + n }}, entries: []fileTarEntry{reg("f", "x")}, refused: "../f"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dest := filepath.Join(base, "a", "b", "dest")
			os.MkdirAll(dest, 0o755)
			if tc.before != nil {
				tc.before(dest)
			}
			d, err := os.Open(dest)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			opts := tc.opts
			if opts.Rename == nil {
				opts = untar.ExtractOptions{UID: -1, GID: -1}
			}
			_, err = untar.ExtractTar(d, fileTar(t, tc.entries...), opts)
			if tc.refused != "" {
				if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `"`+tc.refused+`"`) {
					t.Errorf("got %v, want a refusal naming %q", err, tc.refused)
				}
				for _, p := range []string{filepath.Join(base, "evil"), filepath.Join(base, "a", "evil"), "/tmp/evil", "/etc/evil"} {
					if _, err := os.Lstat(p); err == nil {
						t.Errorf("%s was made", p)
					}
				}
			} else if err != nil {
				t.Fatalf("extract: %v", err)
			}
			if tc.check != nil {
				tc.check(t, dest)
			}
		})
	}
}

// TestExtractTarMaxSize: a cap on what an extraction makes refuses the
// entry that would pass it, before anything of it is written, and counts
// a sparse entry's whole size.
func TestExtractTarMaxSize(t *testing.T) {
	dest := t.TempDir()
	d, err := os.Open(dest)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, err = untar.ExtractTar(d, fileTar(t, fileTarEntry{name: "a", typ: tar.TypeReg, body: "12345"}, fileTarEntry{name: "b", typ: tar.TypeReg, body: "123456"}), untar.ExtractOptions{UID: -1, GID: -1, MaxSize: 10})
	if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("got %v, want ErrTooLarge naming b", err)
	}
	if _, err := os.Lstat(filepath.Join(dest, "b")); err == nil {
		t.Error("b was written past the cap")
	}
}
