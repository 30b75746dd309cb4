package image

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeHost builds a small host root: merged /usr with symlinks, an /etc
// with allowed and secret files.
func fakeHost(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "usr/lib", "etc/ssl/private", "etc/ssl/certs", "etc/python3", "etc/alternatives", "sbin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("usr/bin", filepath.Join(root, "bin"))
	os.Symlink("usr/lib", filepath.Join(root, "lib"))
	files := map[string]string{
		"etc/passwd":            "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/bin/false\nalice:x:1000:1000::/home/alice:/bin/bash\nnobody:x:65534:65534::/:/bin/false\n",
		"etc/group":             "root:x:0:\nsudo:x:27:alice\nalice:x:1000:\n",
		"etc/shadow":            "root:$6$secret:1:0:99999:7:::\n",
		"etc/ssl/private/key":   "PRIVATE",
		"etc/ssl/certs/ca.pem":  "CERT",
		"etc/python3/site.cfg":  "x",
		"etc/ssh_host_rsa_key":  "HOSTKEY",
		"etc/nsswitch.conf":     "passwd: files\n",
		"etc/machine-id":        "1234",
		"usr/bin/placeholder":   "",
		"etc/resolv.conf":       "nameserver 10.0.0.1\n",
		"etc/hosts":             "10.1.2.3 internal-host\n",
		"etc/hostname":          "host-name\n",
		"etc/ld.so.cache":       "cache",
		"etc/alternatives/none": "",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestBuildHost(t *testing.T) {
	host := fakeHost(t)
	img, err := buildHost(filepath.Join(t.TempDir(), "host"), host)
	if err != nil {
		t.Fatal(err)
	}
	rootfs := img.Layers[0]
	read := func(p string) string {
		b, _ := os.ReadFile(filepath.Join(rootfs, p))
		return string(b)
	}
	// Allowed config comes along; secrets and host identity do not.
	if read("etc/ssl/certs/ca.pem") != "CERT" || read("etc/ld.so.cache") != "cache" || read("etc/python3/site.cfg") != "x" {
		t.Error("allowed /etc files are missing")
	}
	for _, p := range []string{"etc/ssl/private/key", "etc/ssh_host_rsa_key", "etc/machine-id"} {
		if _, err := os.Lstat(filepath.Join(rootfs, p)); err == nil {
			t.Errorf("%s was copied into the image", p)
		}
	}
	if strings.Contains(read("etc/shadow"), "$6$") || strings.Contains(read("etc/hosts"), "internal-host") ||
		strings.Contains(read("etc/resolv.conf"), "10.0.0.1") || strings.Contains(read("etc/hostname"), "host-name") {
		t.Error("host secrets or identity leaked into /etc")
	}
	// Host users above 1000 are dropped; the sandbox's own user is added.
	pw := read("etc/passwd")
	if strings.Contains(pw, "alice") || !strings.Contains(pw, "user:x:1000:1000") || !strings.Contains(pw, "daemon:x:1:1") {
		t.Errorf("passwd = %q", pw)
	}
	if gr := read("etc/group"); strings.Contains(gr, "alice") || !strings.Contains(gr, "sudo:x:27:user") {
		t.Errorf("group = %q", gr)
	}
	// Merged-/usr symlinks are mirrored; real directories are bound.
	if l, _ := os.Readlink(filepath.Join(rootfs, "bin")); l != "usr/bin" {
		t.Errorf("bin -> %q", l)
	}
	binds := map[string]bool{}
	for _, b := range img.Binds {
		binds[b.Dest] = true
	}
	if !binds["/usr"] || !binds["/sbin"] || binds["/bin"] {
		t.Errorf("binds = %v", img.Binds)
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp mode %v, want sticky 0777", fi.Mode())
	}
	for _, d := range []string{"workspace", "tmp", "proc", "dev", "home/user"} {
		if fi, err := os.Stat(filepath.Join(rootfs, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s missing", d)
		}
	}

	// Same host, same digest: the skeleton is reused.
	again, err := buildHost(filepath.Dir(filepath.Dir(rootfs)), host)
	if err != nil || again.ID != img.ID {
		t.Fatalf("rebuild: id %s vs %s, %v", again.ID, img.ID, err)
	}
}

func TestStoreGet(t *testing.T) {
	s, err := NewStore(t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("no-such-image"); err == nil {
		t.Fatal("unknown image resolved")
	}
}
