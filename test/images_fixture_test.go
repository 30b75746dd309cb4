package test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The e2e images are built here from the host's own files (a shell, cat,
// env and true with the libraries they load): nothing is downloaded.

// tarEntry is one entry of a layer being built.
type tarEntry struct {
	name     string
	mode     int64
	typ      byte
	body     []byte
	linkname string
}

// layerBytes writes entries as an uncompressed layer tar, directories of
// every path first.
func layerBytes(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	dirs := map[string]bool{}
	for _, e := range entries {
		for d := filepath.Dir(e.name); d != "." && d != "/"; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	var sorted []string
	for d := range dirs {
		sorted = append(sorted, d)
	}
	sort.Strings(sorted)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	write := func(h *tar.Header, body []byte) {
		h.ModTime = mtime
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range sorted {
		write(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.linkname, Size: int64(len(e.body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		write(h, e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

var lddPath = regexp.MustCompile(`(/\S+)\s+\(0x`)

// hostProgramEntries copies host programs (under /bin in the layer) and
// the shared libraries they load (at the paths the loader expects).
func hostProgramEntries(t *testing.T, progs map[string]string) []tarEntry {
	t.Helper()
	var out []tarEntry
	libs := map[string]bool{}
	for dst, src := range progs {
		body, err := os.ReadFile(src)
		if err != nil {
			t.Skipf("host program %s: %v", src, err)
		}
		out = append(out, tarEntry{name: dst, mode: 0o755, body: body})
		ldd, err := exec.Command("ldd", src).Output()
		if err != nil {
			t.Skipf("ldd %s: %v", src, err)
		}
		for _, m := range lddPath.FindAllStringSubmatch(string(ldd), -1) {
			libs[m[1]] = true
		}
	}
	for lib := range libs {
		body, err := os.ReadFile(lib) // follows the symlink to the library itself
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tarEntry{name: strings.TrimPrefix(lib, "/"), mode: 0o755, body: body})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func gzLayer(t *testing.T, raw []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageFixture holds the test images: app is base+top (top whites out
// and hides parts of base), other is base+extra (sharing base with app).
type imageFixture struct {
	base, top, extra v1.Layer
	app, other       v1.Image
}

func buildImages(t *testing.T) *imageFixture {
	t.Helper()
	entries := hostProgramEntries(t, map[string]string{
		"bin/sh": "/bin/sh", "bin/cat": "/bin/cat", "bin/env": "/usr/bin/env", "bin/true": "/bin/true",
	})
	entries = append(entries,
		tarEntry{name: "etc/os-release", mode: 0o644, body: []byte("ID=paddock-e2e\n")},
		// As on systemd hosts: a symlink to a runtime file the image lacks.
		// The daemon binds its own resolv.conf there.
		tarEntry{name: "etc/resolv.conf", typ: tar.TypeSymlink, linkname: "../run/systemd/resolve/stub-resolv.conf"},
		tarEntry{name: "data/keep.txt", mode: 0o644, body: []byte("kept\n")},
		tarEntry{name: "data/gone.txt", mode: 0o644, body: []byte("should be whited out\n")},
		tarEntry{name: "data/olddir/old.txt", mode: 0o644, body: []byte("hidden by an opaque dir\n")},
		tarEntry{name: "data/link.txt", typ: tar.TypeLink, linkname: "data/keep.txt"},
	)
	f := &imageFixture{
		base: gzLayer(t, layerBytes(t, entries)),
		top: gzLayer(t, layerBytes(t, []tarEntry{
			{name: "data/.wh.gone.txt", mode: 0o644},
			{name: "data/olddir/.wh..wh..opq", mode: 0o644},
			{name: "data/olddir/new.txt", mode: 0o644, body: []byte("new\n")},
			{name: "app/hello.txt", mode: 0o644, body: []byte("hello from the image\n")},
		})),
		extra: gzLayer(t, layerBytes(t, []tarEntry{
			{name: "srv/other.txt", mode: 0o644, body: []byte("other image\n")},
		})),
	}
	f.app = withConfig(t, f.base, f.top, v1.Config{
		Env:        []string{"PATH=/bin", "GREETING=hello-env"},
		WorkingDir: "/app",
		User:       "1234",
		Cmd:        []string{"/bin/sh"},
	})
	f.other = withConfig(t, f.base, f.extra, v1.Config{Env: []string{"GREETING=other"}})
	return f
}

func withConfig(t *testing.T, lower, upper v1.Layer, cfg v1.Config) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, lower, upper)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// dockerSave writes img as `docker save` would, to a file.
func dockerSave(t *testing.T, img v1.Image, tag string) string {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(p, ref, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// ociLayoutTar writes img as an OCI image layout named refName, packed
// as a tar.
func ociLayoutTar(t *testing.T, img v1.Image, refName string) []byte {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": refName})); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = rel
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// e2eRegistry is an OCI registry served in-process on loopback, with
// optional credentials (basic, or a bearer token) and a blob it serves
// damaged.
type e2eRegistry struct {
	host                  string
	mu                    sync.Mutex
	user, password, token string
	damaged               string // a digest ("sha256:...") whose blob is served with a byte flipped
}

func startRegistry(t *testing.T) *e2eRegistry {
	t.Helper()
	r := &e2eRegistry{}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		user, password, token, damaged := r.user, r.password, r.token, r.damaged
		r.mu.Unlock()
		if user != "" || token != "" {
			u, p, basic := req.BasicAuth()
			okBasic := basic && user != "" && u == user && p == password
			okToken := token != "" && req.Header.Get("Authorization") == "Bearer "+token
			if !okBasic && !okToken {
				w.Header().Set("WWW-Authenticate", `Basic realm="e2e"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"credentials required"}]}`)
				return
			}
		}
		if damaged == "" || req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+damaged) {
			inner.ServeHTTP(w, req)
			return
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, req)
		body := rec.Body.Bytes()
		if n := len(body); n > 0 {
			body[n*2/3] ^= 0xff
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

func (r *e2eRegistry) set(f func(r *e2eRegistry)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

// push uploads img as repo (with its tag) and returns the reference.
func (r *e2eRegistry) push(t *testing.T, repo string, img v1.Image) string {
	t.Helper()
	ref := r.host + "/" + repo
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := remote.Write(parsed, img, remote.WithContext(ctx)); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref
}

func digestOf(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}
