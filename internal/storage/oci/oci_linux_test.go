package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

var insecure = PullOptions{Insecure: true}

func TestPullByTag(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	reg := newRegistry(t)
	ref := reg.push(t, "test/app:v1", fx.app)
	s := openStore(t)

	img, err := s.Pull(context.Background(), ref, insecure)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != ref || !slices.Equal(img.Names, []string{ref}) {
		t.Errorf("name %q names %q, want %q", img.Name, img.Names, ref)
	}
	if want := mustDigest(t, fx.app).String(); img.Digest != want {
		t.Errorf("digest %s, want %s", img.Digest, want)
	}
	if want := mustConfigName(t, fx.app).String(); img.ID != want {
		t.Errorf("id %s, want %s", img.ID, want)
	}
	if want := []string{reg.host + "/test/app@" + img.Digest}; !slices.Equal(img.RepoDigests, want) {
		t.Errorf("repo digests %q, want %q", img.RepoDigests, want)
	}
	if !slices.Equal(img.Env, []string{"PATH=/usr/bin:/bin", "GREETING=hello"}) || img.Workdir != "/srv" || img.User != "1000:1000" ||
		!slices.Equal(img.Entrypoint, []string{"/usr/bin/hello"}) || !slices.Equal(img.Cmd, []string{"--loud"}) ||
		img.Labels["org.example.test"] != "yes" || !img.Created.Equal(fixtureTime) {
		t.Errorf("config defaults not carried: %+v", img)
	}
	checkAppLayers(t, s, img)

	// The store is root's alone: its layers hold setuid files and devices.
	if fi, err := os.Stat(s.dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("store dir mode %v (%v), want 0700", fi.Mode(), err)
	}

	got, err := s.Get(ref)
	if err != nil || got.ID != img.ID || !slices.Equal(got.Layers, img.Layers) {
		t.Errorf("Get(%s) = %+v, %v", ref, got, err)
	}
	for _, q := range []string{img.ID, img.Digest, img.RepoDigests[0], strings.TrimPrefix(img.ID, "sha256:")[:12]} {
		if got, err := s.Get(q); err != nil || got.ID != img.ID {
			t.Errorf("Get(%s) = %v, %v", q, got, err)
		}
	}
	if _, err := s.Get(reg.host + "/test/app:v2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get of an unknown tag: %v, want ErrNotFound", err)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].ID != img.ID {
		t.Errorf("List = %v, %v", list, err)
	}

	// Pulling again unpacks nothing.
	unpacks := s.unpacks.Load()
	if _, err := s.Pull(context.Background(), ref, insecure); err != nil {
		t.Fatal(err)
	}
	if s.unpacks.Load() != unpacks {
		t.Errorf("second pull unpacked %d layers", s.unpacks.Load()-unpacks)
	}
}

// checkAppLayers checks the unpacked fixture "app" (base.layer under
// top.layer) on disk, layer by layer.
func checkAppLayers(t *testing.T, s *Store, img *Image) {
	t.Helper()
	if len(img.Layers) != 2 {
		t.Fatalf("layers %q, want 2", img.Layers)
	}
	top, base := img.Layers[0], img.Layers[1]
	for _, l := range img.Layers {
		if !strings.HasPrefix(l, s.layersDir()+"/") || filepath.Base(l) != "root" {
			t.Errorf("layer dir %s is not a layer root in the store", l)
		}
	}
	checkBaseLayer(t, base)

	// Top: the whiteout is a 0/0 character device, the opaque dir has both
	// overlay xattrs.
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(top, "etc/motd"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("etc/motd in the top layer is not a whiteout: mode %o rdev %d (%v)", st.Mode, st.Rdev, err)
	}
	if _, err := os.Lstat(filepath.Join(top, "etc/.wh.motd")); !os.IsNotExist(err) {
		t.Errorf("the .wh. file itself was unpacked: %v", err)
	}
	for _, x := range opaqueXattrs {
		if v := getXattr(t, filepath.Join(top, "var/cache"), x); v != "y" {
			t.Errorf("var/cache %s = %q, want y", x, v)
		}
	}
	if _, err := os.Lstat(filepath.Join(top, "var/cache/.wh..wh..opq")); !os.IsNotExist(err) {
		t.Errorf("the opaque marker itself was unpacked: %v", err)
	}
	checkFile(t, top, "var/cache/new.txt", 0o644, 0, 0, "top layer cache entry")
}

func checkBaseLayer(t *testing.T, base string) {
	t.Helper()
	checkFile(t, base, "etc/os-release", 0o644, 0, 0, `NAME="paddock-test"`)
	checkFile(t, base, "usr/bin/hello", 0o755, 0, 0, "hello from paddock")
	checkFile(t, base, "usr/bin/su", 0o4755, 0, 0, "not really su")
	checkFile(t, base, "home/user/notes.txt", 0o600, 1000, 1000, "owned by the image's user")
	checkMode(t, base, "tmp", unix.S_IFDIR|0o1777, 0, 0)
	checkMode(t, base, "home/user", unix.S_IFDIR|0o750, 1000, 1000)
	checkMode(t, base, ".", unix.S_IFDIR|0o755, 0, 0)

	// Hard link: the same inode.
	var a, b unix.Stat_t
	unix.Lstat(filepath.Join(base, "usr/bin/hello"), &a)
	unix.Lstat(filepath.Join(base, "usr/bin/hello-again"), &b)
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hello-again is not a hard link of hello (ino %d vs %d, nlink %d)", a.Ino, b.Ino, a.Nlink)
	}
	// Symlinks verbatim.
	for p, want := range map[string]string{"bin": "usr/bin", "usr/bin/sh": "/usr/bin/hello"} {
		if got, err := os.Readlink(filepath.Join(base, p)); err != nil || got != want {
			t.Errorf("readlink %s = %q, %v; want %q", p, got, err, want)
		}
	}
	// Devices and FIFOs.
	checkNode(t, base, "dev/null", unix.S_IFCHR|0o666, 0, 0, unix.Mkdev(1, 3))
	checkNode(t, base, "dev/loop9", unix.S_IFBLK|0o660, 0, 6, unix.Mkdev(7, 9))
	checkMode(t, base, "run/fifo", unix.S_IFIFO|0o620, 0, 0)

	// Xattrs: user.* and security.capability kept; trusted.*,
	// security.selinux and forged user.overlay.* dropped.
	hello := filepath.Join(base, "usr/bin/hello")
	if v := getXattr(t, hello, "user.paddock.note"); v != "hello" {
		t.Errorf("user.paddock.note = %q", v)
	}
	if v := getXattr(t, hello, "security.capability"); len(v) != 20 || v[0] != 1 || v[3] != 2 {
		t.Errorf("security.capability = %x", v)
	}
	for _, x := range []string{"trusted.overlay.opaque", "security.selinux", "user.overlay.redirect"} {
		if v := getXattr(t, hello, x); v != "" {
			t.Errorf("%s = %q, want it dropped", x, v)
		}
	}
	// Times, directories included (set after their entries).
	for _, p := range []string{"etc/os-release", "usr/bin", "var/cache", "."} {
		fi, err := os.Lstat(filepath.Join(base, p))
		if err != nil || !fi.ModTime().Equal(fixtureTime) {
			t.Errorf("%s mtime %v (%v), want %v", p, fi.ModTime(), err, fixtureTime)
		}
	}
}

func checkFile(t *testing.T, root, p string, perm uint32, uid, gid uint32, contains string) {
	t.Helper()
	checkMode(t, root, p, unix.S_IFREG|perm, uid, gid)
	data, err := os.ReadFile(filepath.Join(root, p))
	if err != nil || !strings.Contains(string(data), contains) {
		t.Errorf("%s: %q (%v), want it to contain %q", p, data, err, contains)
	}
}

func checkMode(t *testing.T, root, p string, mode uint32, uid, gid uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, p), &st); err != nil {
		t.Errorf("%s: %v", p, err)
		return
	}
	if st.Mode != mode || st.Uid != uid || st.Gid != gid {
		t.Errorf("%s: mode %o owner %d:%d, want %o %d:%d", p, st.Mode, st.Uid, st.Gid, mode, uid, gid)
	}
}

func checkNode(t *testing.T, root, p string, mode uint32, uid, gid uint32, dev uint64) {
	t.Helper()
	checkMode(t, root, p, mode, uid, gid)
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, p), &st); err == nil && st.Rdev != dev {
		t.Errorf("%s: rdev %x, want %x", p, st.Rdev, dev)
	}
}

func getXattr(t *testing.T, p, key string) string {
	t.Helper()
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, key, buf)
	if err == unix.ENODATA {
		return ""
	}
	if err != nil {
		t.Errorf("getxattr %s %s: %v", p, key, err)
		return ""
	}
	return string(buf[:n])
}

// TestOverlayMount stacks the unpacked layers with overlayfs the way a
// sandbox does (userxattr) and the way a privileged host mount does, and
// checks the whiteout and the opaque directory take effect.
func TestOverlayMount(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	reg := newRegistry(t)
	ref := reg.push(t, "test/app:v1", fx.app)
	s := openStore(t)
	img, err := s.Pull(context.Background(), ref, insecure)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, opts string }{
		{"userxattr", ",userxattr"},
		{"trusted", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
			for _, d := range []string{upper, work, merged} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			opts := "lowerdir=" + strings.Join(img.Layers, ":") + ",upperdir=" + upper + ",workdir=" + work + tc.opts
			if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
				t.Fatalf("mounting overlay (%s): %v", opts, err)
			}
			t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })

			if _, err := os.Lstat(filepath.Join(merged, "etc/motd")); !os.IsNotExist(err) {
				t.Errorf("etc/motd survived its whiteout: %v", err)
			}
			if _, err := os.Lstat(filepath.Join(merged, "var/cache/old")); !os.IsNotExist(err) {
				t.Errorf("var/cache/old shows through the opaque dir: %v", err)
			}
			entries, err := os.ReadDir(filepath.Join(merged, "var/cache"))
			if err != nil || len(entries) != 1 || entries[0].Name() != "new.txt" {
				t.Errorf("var/cache holds %v (%v), want only new.txt", entries, err)
			}
			for _, p := range []string{"etc/os-release", "etc/hostname", "usr/bin/hello", "bin/hello-again"} {
				if _, err := os.Stat(filepath.Join(merged, p)); err != nil {
					t.Errorf("%s: %v", p, err)
				}
			}
			// The overlay's own xattrs are not visible through it.
			var buf [16]byte
			if _, err := unix.Lgetxattr(filepath.Join(merged, "var/cache"), "user.overlay.opaque", buf[:]); err != unix.ENODATA && tc.opts != "" {
				t.Errorf("user.overlay.opaque visible through the overlay: %v", err)
			}
			// Deleting in the merged tree writes a whiteout to the upper
			// layer and never touches the shared lower layer.
			if err := os.Remove(filepath.Join(merged, "etc/os-release")); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(img.Layers[1], "etc/os-release")); err != nil {
				t.Errorf("lower layer changed: %v", err)
			}
		})
	}
}

func TestPullByDigest(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	reg := newRegistry(t)
	reg.push(t, "test/app:v1", fx.app)
	reg.push(t, "test/base:v1", fx.base)
	d := mustDigest(t, fx.app).String()
	s := openStore(t)

	pinned := reg.host + "/test/app@" + d
	img, err := s.Pull(context.Background(), pinned, insecure)
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != d || img.Name != pinned {
		t.Errorf("pinned pull: digest %s name %s", img.Digest, img.Name)
	}
	if got, err := s.Get(pinned); err != nil || got.ID != img.ID {
		t.Errorf("Get(%s) = %v, %v", pinned, got, err)
	}

	// A digest the repository does not have (here: another image's) is
	// refused, not resolved to something else.
	other := reg.host + "/test/app@" + mustDigest(t, fx.base).String()
	if _, err := s.Pull(context.Background(), other, insecure); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("wrong digest: %v, want ErrNotFound", err)
	}
	// A registry answering a pin with other bytes is caught.
	reg.setCorrupt(d)
	s2 := openStore(t)
	_, err = s2.Pull(context.Background(), pinned, insecure)
	if err == nil || !strings.Contains(err.Error(), "digest") {
		t.Errorf("tampered pinned manifest: %v, want a digest error", err)
	}
	if n := len(s2.images); n != 0 {
		t.Errorf("%d images stored after a tampered pull", n)
	}
	// A malformed pin is invalid.
	if _, err := s.Pull(context.Background(), reg.host+"/test/app@sha256:abc", insecure); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("malformed digest: %v, want ErrInvalid", err)
	}
}

func TestPullAuth(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	reg := newRegistry(t)
	ref := reg.push(t, "test/app:v1", fx.app)
	reg.setAuth("agent", "s3cret")
	s := openStore(t)

	for _, tc := range []struct {
		name string
		opts PullOptions
	}{
		{"anonymous", PullOptions{Insecure: true}},
		{"wrong password", PullOptions{Insecure: true, Username: "agent", Password: "guess"}},
		{"wrong authenticator", PullOptions{Insecure: true, Auth: &authn.Basic{Username: "someone", Password: "s3cret"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Pull(context.Background(), ref, tc.opts)
			if !errors.Is(err, errdefs.ErrDenied) || !strings.Contains(err.Error(), "authentication failed") {
				t.Errorf("err = %v, want ErrDenied saying authentication failed", err)
			}
			if len(layerDirs(t, s)) != 0 {
				t.Errorf("layers left: %v", layerDirs(t, s))
			}
		})
	}
	t.Run("right password", func(t *testing.T) {
		if _, err := s.Pull(context.Background(), ref, PullOptions{Insecure: true, Username: "agent", Password: "s3cret"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("authenticator", func(t *testing.T) {
		if _, err := s.Pull(context.Background(), ref, PullOptions{Insecure: true, Auth: &authn.Basic{Username: "agent", Password: "s3cret"}}); err != nil {
			t.Fatal(err)
		}
	})
}

func TestPullRefusals(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	reg := newRegistry(t)
	ref := reg.push(t, "test/app:v1", fx.app)
	s := openStore(t)
	ctx := context.Background()

	// Plain HTTP only when asked, loopback included.
	_, err := s.Pull(ctx, ref, PullOptions{})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "plain HTTP") {
		t.Errorf("plain http without Insecure: %v", err)
	}
	// No implied registry.
	if _, err := s.Pull(ctx, "test/app:v1", insecure); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "names no registry") {
		t.Errorf("no registry: %v", err)
	}
	if _, err := s.Pull(ctx, reg.host+"/Bad Name", insecure); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("bad reference: %v", err)
	}
	if _, err := s.Pull(ctx, reg.host+"/test/nothing:v1", insecure); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown repository: %v", err)
	}
	if _, err := s.Pull(ctx, ref, PullOptions{Insecure: true, Platform: "windows"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("bad platform: %v", err)
	}
}

// TestCorruptBlob flips one byte of a layer blob in transit (the registry)
// and inside an archive: the image is refused with a clear error and
// nothing is left behind, not even the layers that unpacked fine.
func TestCorruptBlob(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	t.Run("registry", func(t *testing.T) {
		reg := newRegistry(t)
		ref := reg.push(t, "test/app:v1", fx.app)
		layers, _ := fx.app.Layers()
		top, _ := layers[1].Digest()
		reg.setCorrupt(top.String())
		s := openStore(t)
		_, err := s.Pull(context.Background(), ref, insecure)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), top.String()) {
			t.Fatalf("err = %v, want ErrInvalid naming the corrupt blob %s", err, top)
		}
		t.Log(err)
		checkEmpty(t, s)
		// The registry fixed: the same store pulls fine.
		reg.setCorrupt("")
		img, err := s.Pull(context.Background(), ref, insecure)
		if err != nil {
			t.Fatal(err)
		}
		checkAppLayers(t, s, img)
	})
	t.Run("archive", func(t *testing.T) {
		// An uncompressed layer: the flipped byte lands in a file's
		// contents, so the tar still parses and only the diff ID notices.
		img := testImage(t, static.NewLayer(fx.baseTar, types.DockerUncompressedLayer), tarLayer(t, fx.topTar))
		var buf bytes.Buffer
		if err := tarball.Write(name.MustParseReference("127.0.0.1:5000/test/archive:v1"), img, &buf); err != nil {
			t.Fatal(err)
		}
		data := buf.Bytes()
		i := bytes.Index(data, []byte("hello from paddock"))
		if i < 0 {
			t.Fatal("fixture text not found in the archive")
		}
		data[i] ^= 0x20
		s := openStore(t)
		_, err := s.Import(context.Background(), bytes.NewReader(data), "")
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), "diff ID") {
			t.Fatalf("err = %v, want ErrInvalid: layer content does not match its diff ID", err)
		}
		t.Log(err)
		checkEmpty(t, s)
	})
}

// checkEmpty checks that a store holds no image, no layer and no
// temporary file.
func checkEmpty(t *testing.T, s *Store) {
	t.Helper()
	if d := layerDirs(t, s); len(d) != 0 {
		t.Errorf("layers left behind: %v", d)
	}
	for _, sub := range []string{"images", "tmp"} {
		if entries, _ := os.ReadDir(filepath.Join(s.dir, sub)); len(entries) != 0 {
			t.Errorf("%s not empty: %v", sub, entries)
		}
	}
	if list, _ := s.List(); len(list) != 0 {
		t.Errorf("images listed: %v", list)
	}
}

func TestImportDockerArchive(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	const ref = "127.0.0.1:5000/test/docker:v1"
	var buf bytes.Buffer
	if err := tarball.Write(name.MustParseReference(ref), fx.app, &buf); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	img, err := s.Import(context.Background(), bytes.NewReader(buf.Bytes()), "")
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != ref || img.ID != mustConfigName(t, fx.app).String() || img.Digest != img.ID {
		t.Errorf("imported %s id %s digest %s", img.Name, img.ID, img.Digest)
	}
	checkAppLayers(t, s, img)

	// Another name, from a gzip-compressed archive: the same image (no
	// layer unpacked again), two names.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(buf.Bytes())
	zw.Close()
	unpacks := s.unpacks.Load()
	img2, err := s.Import(context.Background(), &gz, "local/renamed:v2")
	if err != nil {
		t.Fatal(err)
	}
	if img2.ID != img.ID || img2.Name != "local/renamed:v2" || len(img2.Names) != 2 || s.unpacks.Load() != unpacks {
		t.Errorf("re-import: %+v (unpacked %d)", img2, s.unpacks.Load()-unpacks)
	}
	if _, err := s.Import(context.Background(), bytes.NewReader(buf.Bytes()), "host"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("the built-in image's name: %v", err)
	}
	if _, err := s.Import(context.Background(), strings.NewReader("not a tar at all, just text that is long enough........................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................"), ""); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("garbage: %v", err)
	}
}

func TestImportOCILayout(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(fx.app, layout.WithAnnotations(map[string]string{annotationRefName: "127.0.0.1:5000/test/oci:v1"})); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	img, err := s.Import(context.Background(), bytes.NewReader(tarDir(t, dir)), "")
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != "127.0.0.1:5000/test/oci:v1" || img.Digest != mustDigest(t, fx.app).String() {
		t.Errorf("imported %s digest %s", img.Name, img.Digest)
	}
	checkAppLayers(t, s, img)

	// Two images: a name must pick one.
	if err := p.AppendImage(fx.base, layout.WithAnnotations(map[string]string{annotationRefName: "127.0.0.1:5000/test/oci-base:v1"})); err != nil {
		t.Fatal(err)
	}
	two := tarDir(t, dir)
	if _, err := s.Import(context.Background(), bytes.NewReader(two), ""); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "oci-base") {
		t.Errorf("ambiguous archive: %v", err)
	}
	b, err := s.Import(context.Background(), bytes.NewReader(two), "127.0.0.1:5000/test/oci-base:v1")
	if err != nil {
		t.Fatal(err)
	}
	if b.ID != mustConfigName(t, fx.base).String() || len(b.Layers) != 1 || b.Layers[0] != img.Layers[1] {
		t.Errorf("picked %+v", b)
	}
	// A corrupt manifest blob in the layout is refused.
	blob := filepath.Join(dir, "blobs/sha256", strings.TrimPrefix(mustDigest(t, fx.base).String(), "sha256:"))
	data, _ := os.ReadFile(blob)
	os.WriteFile(blob, append(data, ' '), 0o644)
	if _, err := s.Import(context.Background(), bytes.NewReader(tarDir(t, dir)), "127.0.0.1:5000/test/oci-base:v1"); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("corrupt manifest: %v", err)
	}
}

// tarDir writes a directory tree as a tar, as `tar -C dir -c .` would.
func tarDir(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = rel
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tw.Close()
	return buf.Bytes()
}

func TestLayerSharing(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	reg := newRegistry(t)
	baseRef := reg.push(t, "test/base:v1", fx.base)
	appRef := reg.push(t, "test/app:v1", fx.app)
	s := openStore(t)
	ctx := context.Background()

	base, err := s.Pull(ctx, baseRef, insecure)
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := fx.app.Layers()
	baseBlob, _ := layers[0].Digest()
	gets := reg.gets(baseBlob.String())
	app, err := s.Pull(ctx, appRef, insecure)
	if err != nil {
		t.Fatal(err)
	}
	if s.unpacks.Load() != 2 {
		t.Errorf("unpacked %d layers for two images sharing one, want 2", s.unpacks.Load())
	}
	if reg.gets(baseBlob.String()) != gets {
		t.Errorf("the shared layer's blob was fetched again")
	}
	if app.Layers[1] != base.Layers[0] {
		t.Errorf("the shared layer has two directories: %s and %s", app.Layers[1], base.Layers[0])
	}
	if d := layerDirs(t, s); len(d) != 2 {
		t.Errorf("layer dirs %v, want 2", d)
	}
	// Disk: one copy of the base layer's files (the same inode).
	var a, b unix.Stat_t
	unix.Stat(filepath.Join(base.Layers[0], "etc/os-release"), &a)
	unix.Stat(filepath.Join(app.Layers[1], "etc/os-release"), &b)
	if a.Ino != b.Ino || a.Dev != b.Dev {
		t.Errorf("two copies of etc/os-release")
	}
}

func TestConcurrentPulls(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	reg := newRegistry(t)
	appRef := reg.push(t, "test/app:v1", fx.app)
	baseRef := reg.push(t, "test/base:v1", fx.base)
	s := openStore(t)

	refs := []string{appRef, appRef, baseRef, appRef}
	imgs := make([]*Image, len(refs))
	errs := make([]error, len(refs))
	var wg sync.WaitGroup
	for i, ref := range refs {
		wg.Go(func() { imgs[i], errs[i] = s.Pull(context.Background(), ref, insecure) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
	}
	if s.unpacks.Load() != 2 {
		t.Errorf("unpacked %d layers, want 2", s.unpacks.Load())
	}
	if imgs[0].ID != imgs[1].ID || imgs[2].Layers[0] != imgs[0].Layers[1] {
		t.Errorf("concurrent pulls disagree: %v %v", imgs[0], imgs[2])
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pins) != 0 {
		t.Errorf("pins left: %v", s.pins)
	}
}

func TestRemove(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	reg := newRegistry(t)
	baseRef := reg.push(t, "test/base:v1", fx.base)
	appRef := reg.push(t, "test/app:v1", fx.app)
	s := openStore(t)
	ctx := context.Background()
	base, err := s.Pull(ctx, baseRef, insecure)
	if err != nil {
		t.Fatal(err)
	}
	app, err := s.Pull(ctx, appRef, insecure)
	if err != nil {
		t.Fatal(err)
	}
	topDir, baseDir := app.Layers[0], app.Layers[1]
	mounted := map[string][]string{topDir: {"sandbox sb-1", "sandbox sb-2"}}
	inUse := func(layer string) []string { return mounted[layer] }

	// A layer in use: nothing is removed, and the error says who.
	err = s.Remove(appRef, inUse)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "sb-1") || !strings.Contains(err.Error(), "sb-2") {
		t.Fatalf("remove of an image in use: %v", err)
	}
	if _, err := s.Get(appRef); err != nil {
		t.Errorf("image gone after a refused remove: %v", err)
	}
	// A second name only untags.
	if _, err := s.Import(ctx, bytes.NewReader(dockerArchive(t, fx.app)), "local/app:v1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("local/app:v1", inUse); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("local/app:v1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("name still there: %v", err)
	}
	if _, err := os.Stat(topDir); err != nil {
		t.Errorf("untagging removed a layer: %v", err)
	}

	// Unmounted: the image goes, with its own layer; the shared base stays
	// for the base image.
	delete(mounted, topDir)
	mounted[baseDir] = []string{"sandbox sb-3"}
	if err := s.Remove(appRef, inUse); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(appRef); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after Remove: %v", err)
	}
	if _, err := os.Stat(topDir); !os.IsNotExist(err) {
		t.Errorf("the top layer survived: %v", err)
	}
	if _, err := os.Stat(baseDir); err != nil {
		t.Errorf("the shared layer went: %v", err)
	}
	// The base image's layer is mounted now.
	if err := s.Remove(base.ID, inUse); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "sb-3") {
		t.Errorf("remove of the base in use: %v", err)
	}
	if err := s.Remove(base.ID, nil); err != nil {
		t.Fatal(err)
	}
	checkEmpty(t, s)
	if entries, _ := os.ReadDir(filepath.Join(s.dir, "blobs/sha256")); len(entries) != 0 {
		t.Errorf("blobs left: %v", entries)
	}
	if err := s.Remove(base.ID, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second remove: %v", err)
	}
}

func dockerArchive(t *testing.T, img v1.Image) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := tarball.Write(name.MustParseReference("127.0.0.1:5000/test/archive:v1"), img, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestOpenRecovers simulates a crash: unpacks, deletions and writes left
// half-done are cleaned at Open, complete images survive, and an orphan
// layer waits for Prune.
func TestOpenRecovers(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	dir := filepath.Join(t.TempDir(), "images")
	s, err := Open(dir, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, testLogger(t)); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("second Open of the same dir: %v", err)
	}
	img, err := s.Import(context.Background(), bytes.NewReader(dockerArchive(t, fx.app)), "")
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := s.Import(context.Background(), bytes.NewReader(dockerArchive(t, testImage(t, tarLayer(t, writeTar(t, []*tar.Header{{Name: "orphan.txt", Typeflag: tar.TypeReg, Mode: 0o644}}, nil))))), "local/orphan")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()

	// The crash: an unpack cut short, a deletion cut short, a layer
	// without its metadata, a half-written record and names file, a
	// spooled archive, and a record lost (its layer is now an orphan).
	layers := filepath.Join(dir, "layers")
	leftovers := []string{
		filepath.Join(layers, ".tmp-"+strings.Repeat("a", 64)+"-123", "root", "etc"),
		filepath.Join(layers, ".del-"+strings.Repeat("b", 64)+"-456", "root", "usr"),
		filepath.Join(layers, strings.Repeat("c", 64), "root"),
	}
	for _, p := range leftovers {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(p, "half"), []byte("half-written"), 0o644)
	}
	for _, p := range []string{"images/.tmp-x.json-1", "tmp/import-1", "blobs/sha256/.tmp-y-2"} {
		os.WriteFile(filepath.Join(dir, p), []byte("{"), 0o600)
	}
	os.Remove(filepath.Join(dir, "images", strings.TrimPrefix(orphan.ID, "sha256:")+".json"))

	s2, err := Open(dir, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for _, p := range leftovers {
		if _, err := os.Stat(filepath.Dir(p)); !os.IsNotExist(err) {
			t.Errorf("%s survived Open: %v", p, err)
		}
	}
	for _, p := range []string{"images/.tmp-x.json-1", "tmp/import-1", "blobs/sha256/.tmp-y-2"} {
		if _, err := os.Stat(filepath.Join(dir, p)); !os.IsNotExist(err) {
			t.Errorf("%s survived Open: %v", p, err)
		}
	}
	got, err := s2.Get(img.Name)
	if err != nil || !slices.Equal(got.Layers, img.Layers) {
		t.Fatalf("image after restart: %v, %v", got, err)
	}
	checkAppLayers(t, s2, got)
	if _, err := s2.Get("local/orphan"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the lost record's name: %v", err)
	}
	// The orphan layer: kept while mounted, pruned after.
	orphanDir := orphan.Layers[0]
	n, _, err := s2.Prune(func(l string) []string {
		if l == orphanDir {
			return []string{"sandbox sb-9"}
		}
		return nil
	})
	if err != nil || n != 0 {
		t.Errorf("prune of a mounted orphan: %d, %v", n, err)
	}
	n, _, err = s2.Prune(nil)
	if err != nil || n != 1 {
		t.Errorf("prune: %d, %v", n, err)
	}
	if _, err := os.Stat(orphanDir); !os.IsNotExist(err) {
		t.Errorf("orphan layer survived Prune: %v", err)
	}
	if _, err := os.Stat(got.Layers[0]); err != nil {
		t.Errorf("Prune removed a used layer: %v", err)
	}
}

func TestZstdLayer(t *testing.T) {
	needRoot(t)
	fx := loadFixtures(t)
	img := testImage(t, tarLayer(t, fx.baseTar, tarball.WithCompression(compression.ZStd)), tarLayer(t, fx.topTar, tarball.WithCompression(compression.ZStd)))
	reg := newRegistry(t)
	ref := reg.push(t, "test/zstd:v1", img)
	s := openStore(t)
	got, err := s.Pull(context.Background(), ref, insecure)
	if err != nil {
		t.Fatal(err)
	}
	checkAppLayers(t, s, got)
}
