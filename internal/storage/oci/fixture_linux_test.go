package oci

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// fixtureTime is every fixture entry's mtime.
var fixtureTime = time.Date(2021, 2, 3, 4, 5, 6, 0, time.UTC)

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: unpacking sets owners, device nodes and trusted.* xattrs")
	}
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// openStore opens a store in a fresh directory, closed at the end.
func openStore(t testing.TB, opts ...Option) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "images"), testLogger(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// layerTar builds a layer tar from a testdata/*.layer description.
func layerTar(t testing.TB, file string) []byte {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var entries []*tar.Header
	var contents [][]byte
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		hdr, data, err := fixtureEntry(fields)
		if err != nil {
			t.Fatalf("%s:%d: %v", file, line, err)
		}
		entries = append(entries, hdr)
		contents = append(contents, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return writeTar(t, entries, contents)
}

func fixtureEntry(f []string) (*tar.Header, []byte, error) {
	if len(f) < 4 {
		return nil, nil, fmt.Errorf("want kind path mode owner [arg]")
	}
	kind, p := f[0], f[1]
	hdr := &tar.Header{Name: p, ModTime: fixtureTime, Format: tar.FormatPAX}
	if f[2] != "-" {
		m, err := strconv.ParseInt(f[2], 8, 64)
		if err != nil {
			return nil, nil, err
		}
		hdr.Mode = m
	}
	if f[3] != "-" {
		if _, err := fmt.Sscanf(f[3], "%d:%d", &hdr.Uid, &hdr.Gid); err != nil {
			return nil, nil, err
		}
	}
	arg := ""
	rest := f[4:]
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "xattr:") {
		arg, rest = rest[0], rest[1:]
	}
	for _, x := range rest {
		kv, ok := strings.CutPrefix(x, "xattr:")
		k, v, ok2 := strings.Cut(kv, "=")
		if !ok || !ok2 {
			return nil, nil, fmt.Errorf("bad xattr %q", x)
		}
		if h, ok := strings.CutPrefix(v, "hex:"); ok {
			b, err := hex.DecodeString(h)
			if err != nil {
				return nil, nil, err
			}
			v = string(b)
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+k] = v
	}
	var data []byte
	switch kind {
	case "dir":
		hdr.Typeflag = tar.TypeDir
		if p != "." {
			hdr.Name = p + "/"
		} else {
			hdr.Name = "./"
		}
	case "file":
		hdr.Typeflag = tar.TypeReg
		if arg != "-" && arg != "" {
			b, err := os.ReadFile(filepath.Join("testdata", arg))
			if err != nil {
				return nil, nil, err
			}
			data = b
		}
		hdr.Size = int64(len(data))
	case "symlink":
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, arg
	case "link":
		hdr.Typeflag, hdr.Linkname = tar.TypeLink, arg
	case "char", "block":
		hdr.Typeflag = tar.TypeChar
		if kind == "block" {
			hdr.Typeflag = tar.TypeBlock
		}
		if _, err := fmt.Sscanf(arg, "%d:%d", &hdr.Devmajor, &hdr.Devminor); err != nil {
			return nil, nil, err
		}
	case "fifo":
		hdr.Typeflag = tar.TypeFifo
	default:
		return nil, nil, fmt.Errorf("unknown kind %q", kind)
	}
	return hdr, data, nil
}

func writeTar(t testing.TB, hdrs []*tar.Header, contents [][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("writing %s: %v", h.Name, err)
		}
		if i < len(contents) && len(contents[i]) > 0 {
			if _, err := tw.Write(contents[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// tarLayer makes a (gzip, unless told otherwise) layer from tar bytes.
func tarLayer(t testing.TB, data []byte, opts ...tarball.LayerOption) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage stacks layers (base first) under a config with defaults the
// tests check.
func testImage(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: fixtureTime}
	cf.Config.Env = []string{"PATH=/usr/bin:/bin", "GREETING=hello"}
	cf.Config.WorkingDir = "/srv"
	cf.Config.User = "1000:1000"
	cf.Config.Entrypoint = []string{"/usr/bin/hello"}
	cf.Config.Cmd = []string{"--loud"}
	cf.Config.Labels = map[string]string{"org.example.test": "yes"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// fixtures are the images most tests use.
type fixtures struct {
	baseTar, topTar []byte
	base            v1.Image // base.layer
	app             v1.Image // base.layer + top.layer
}

var (
	fixturesOnce sync.Once
	fixtureSet   *fixtures
)

func loadFixtures(t testing.TB) *fixtures {
	t.Helper()
	fixturesOnce.Do(func() {
		f := &fixtures{baseTar: layerTar(t, "base.layer"), topTar: layerTar(t, "top.layer")}
		baseLayer := tarLayer(t, f.baseTar)
		f.base = testImage(t, baseLayer)
		f.app = testImage(t, baseLayer, tarLayer(t, f.topTar))
		fixtureSet = f
	})
	if fixtureSet == nil {
		t.Fatal("fixtures failed to build")
	}
	return fixtureSet
}

// testRegistry is go-containerregistry's in-memory registry on loopback,
// with switches to demand basic auth and to corrupt one blob in transit.
type testRegistry struct {
	host string // 127.0.0.1:port

	mu       sync.Mutex
	user     string // when set, requests need these basic-auth credentials
	password string
	corrupt  string // digest of a blob (or manifest) whose responses get one byte flipped
	blobGets map[string]int
}

func newRegistry(t testing.TB) *testRegistry {
	t.Helper()
	r := &testRegistry{blobGets: map[string]int{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		user, password, corrupt := r.user, r.password, r.corrupt
		if i := strings.LastIndex(req.URL.Path, "/blobs/"); i >= 0 && req.Method == http.MethodGet {
			r.blobGets[req.URL.Path[i+len("/blobs/"):]]++
		}
		r.mu.Unlock()
		if user != "" {
			u, p, ok := req.BasicAuth()
			if !ok || u != user || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="paddock-test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
		}
		if corrupt != "" && req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/"+corrupt) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			body := rec.Body.Bytes()
			if len(body) > 0 {
				body[len(body)/2] ^= 0x55
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(body)
			return
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

func (r *testRegistry) setAuth(user, password string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.user, r.password = user, password
}

func (r *testRegistry) setCorrupt(digest string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.corrupt = digest
}

func (r *testRegistry) gets(digest string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGets[digest]
}

// push uploads img as host/repo and returns the full reference.
func (r *testRegistry) push(t testing.TB, repo string, img v1.Image) string {
	t.Helper()
	ref := r.host + "/" + repo
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(parsed, img, remote.WithContext(context.Background())); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref
}

// layerDirs lists the entries of the store's layers directory.
func layerDirs(t testing.TB, s *Store) []string {
	t.Helper()
	entries, err := os.ReadDir(s.layersDir())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func mustDigest(t testing.TB, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustConfigName(t testing.TB, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return d
}
