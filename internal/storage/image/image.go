// Package image owns the read-only bottom of every sandbox's root
// filesystem. Today that is the built-in "host" image: the host's /usr (and
// /bin, /lib*, /sbin where they are real directories) bind-mounted read-only,
// over a small skeleton with a curated /etc. Any other name is an OCI image
// (oci.go), behind the same Image shape: read-only layers plus defaults.
package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/paddock-dev/paddock/internal/storage/oci"
)

// HostImage is the name of the built-in image.
const HostImage = "host"

// skeletonVersion changes whenever the skeleton's layout changes, so that a
// new binary builds a new content-addressed directory instead of reusing a
// stale one.
const skeletonVersion = "host-skeleton-4"

// Image is a resolved image: everything the runtime needs to build a root
// filesystem from it.
type Image struct {
	Name string
	// ID is a content digest of the image's layers.
	ID string
	// Layers are read-only host directories, top-most first (overlayfs
	// lowerdir order).
	Layers []string
	// Binds are host directories mounted read-only into the rootfs.
	Binds []Bind
	// Env is the image's default environment (KEY=VALUE).
	Env []string
	// Workdir is the default working directory.
	Workdir string
	// AllowSetuid lets the image's setuid programs (sudo) work: its
	// layers and binds are attached without nosuid and the sandbox's
	// processes run without no_new_privs (base.go).
	AllowSetuid bool
}

// Bind is a host directory mounted into the rootfs.
type Bind struct {
	Source string // absolute host path
	Dest   string // absolute path inside the sandbox
}

// Store resolves image names.
type Store struct {
	dir string
	log *slog.Logger

	mu   sync.Mutex
	host *Image
	oci  *oci.Store // OCI images (oci.go); nil: none
	base *Image     // base.go
}

// NewStore returns a Store keeping its files under dir.
func NewStore(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating image dir: %w", err)
	}
	return &Store{dir: dir, log: log}, nil
}

// Get resolves an image name; "" means the host image.
func (s *Store) Get(name string) (*Image, error) {
	if name == "" {
		name = HostImage
	}
	if name == BaseImage {
		return s.getBase()
	}
	if name != HostImage {
		return s.getOCI(name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.host == nil {
		img, err := buildHost(filepath.Join(s.dir, "host"), "/")
		if err != nil {
			return nil, fmt.Errorf("building host image: %w", err)
		}
		s.log.Info("host image ready", "id", img.ID[:12], "layers", img.Layers)
		s.host = img
	}
	return s.host, nil
}

// topDirs are the host's top-level directories that the host image brings
// in. Each is mirrored as a symlink when it is one on the host (merged-/usr
// systems) and bind-mounted read-only when it is a directory.
var topDirs = []string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// etcAllow lists the parts of the host's /etc a sandbox gets: what programs
// need to run (loader cache, certificates, alternatives, locale, language
// runtimes' config), never credentials, keys or host identity.
var etcAllow = []string{
	"alternatives", "bash.bashrc", "bash_completion.d", "ca-certificates",
	"ca-certificates.conf", "debian_version", "environment", "ethertypes",
	"fonts", "gai.conf", "gitconfig", "host.conf", "inputrc", "issue",
	"java-17-openjdk", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
	"locale.alias", "locale.gen", "localtime", "login.defs", "magic",
	"magic.mime", "mime.types", "netconfig", "networks", "nsswitch.conf",
	"os-release", "perl", "profile", "profile.d", "protocols", "python3",
	"python3.11", "rpc", "services", "shells", "skel", "ssl", "terminfo",
	"timezone", "vim", "wgetrc", "xattr.conf",
}

// etcDeny lists paths under allowed entries that are still secret.
var etcDeny = []string{"ssl/private"}

// buildHost builds the host image's skeleton under dir (content-addressed,
// reused when unchanged) from the host root hostRoot.
func buildHost(dir, hostRoot string) (*Image, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "rootfs")

	img := &Image{Name: HostImage, Workdir: "/workspace"}
	if err := buildSkeleton(root, hostRoot, img); err != nil {
		return nil, err
	}
	id, err := digestTree(root)
	if err != nil {
		return nil, fmt.Errorf("hashing skeleton: %w", err)
	}
	img.ID = id
	final := filepath.Join(dir, id)
	if _, err := os.Stat(final); err != nil {
		if err := os.Rename(tmp, final); err != nil {
			return nil, fmt.Errorf("publishing skeleton: %w", err)
		}
	}
	img.Layers = []string{filepath.Join(final, "rootfs")}
	img.Env = DefaultEnv(hostRoot)
	return img, nil
}

func buildSkeleton(root, hostRoot string, img *Image) error {
	dirs := []struct {
		path string
		mode fs.FileMode
	}{
		{"", 0o755}, {"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555},
		{"tmp", fs.ModeSticky | 0o777}, {"run", 0o755}, {"var", 0o755}, {"var/tmp", fs.ModeSticky | 0o777},
		{"var/lib", 0o755}, {"var/cache", 0o755}, {"var/log", 0o755},
		{"root", 0o700}, {"home", 0o755}, {"home/user", 0o755},
		{"workspace", 0o755}, {"mnt", 0o755}, {"opt", 0o755}, {"srv", 0o755},
		{"media", 0o755}, {"etc", 0o755},
		// Where the gateway binds a sandbox's CA and its self tree: there
		// in the image, a guest's Prepare makes nothing in the sandbox's
		// writable layer (a copy-up of /etc or /run and a file or a
		// directory made on its disk, every one journaled, cost each
		// sandbox's start and teardown).
		{"etc/paddock", 0o755}, {"run/paddock", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(root, d.path)
		if err := os.Mkdir(p, d.mode); err != nil && !os.IsExist(err) {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	// Only root can give the home away; a process that is not (a unit
	// test's, whose sandboxes are fakes) keeps it.
	if err := os.Chown(filepath.Join(root, "home/user"), 1000, 1000); err != nil && (os.Geteuid() == 0 || !errors.Is(err, fs.ErrPermission)) {
		return err
	}
	for _, name := range topDirs {
		src := filepath.Join(hostRoot, name)
		fi, err := os.Lstat(src)
		if err != nil {
			continue
		}
		dst := filepath.Join(root, name)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, dst); err != nil {
				return err
			}
		case fi.IsDir():
			if err := os.Mkdir(dst, 0o755); err != nil {
				return err
			}
			img.Binds = append(img.Binds, Bind{Source: src, Dest: "/" + name})
		}
	}
	etc := filepath.Join(root, "etc")
	for _, name := range etcAllow {
		if err := copyTree(filepath.Join(hostRoot, "etc", name), filepath.Join(etc, name), name); err != nil {
			return fmt.Errorf("copying /etc/%s: %w", name, err)
		}
	}
	if err := os.Symlink("../proc/self/mounts", filepath.Join(etc, "mtab")); err != nil {
		return err
	}
	files := map[string]string{
		"passwd":         passwd(filepath.Join(hostRoot, "etc/passwd")),
		"group":          group(filepath.Join(hostRoot, "etc/group")),
		"shadow":         "root:*:19000:0:99999:7:::\nuser:*:19000:0:99999:7:::\n",
		"hosts":          "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"hostname":       "sandbox\n",
		"resolv.conf":    "# paddock: no network yet\n",
		"paddock/ca.pem": "", // the gateway binds the sandbox's CA here
	}
	for name, content := range files {
		mode := fs.FileMode(0o644)
		if name == "shadow" {
			mode = 0o640
		}
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), mode); err != nil {
			return err
		}
	}
	return nil
}

// copyTree copies src to dst: regular files, directories and symlinks.
// Anything else (sockets, devices) and anything unreadable is skipped:
// the image is a convenience copy, not a mirror.
func copyTree(src, dst, rel string) error {
	for _, d := range etcDeny {
		if rel == d {
			return nil
		}
	}
	fi, err := os.Lstat(src)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case fi.IsDir():
		if err := os.Mkdir(dst, fi.Mode().Perm()); err != nil {
			return err
		}
		entries, err := os.ReadDir(src)
		if err != nil {
			return nil
		}
		for _, e := range entries {
			if err := copyTree(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), rel+"/"+e.Name()); err != nil {
				return err
			}
		}
		return os.Chmod(dst, fi.Mode().Perm())
	case fi.Mode().IsRegular():
		in, err := os.Open(src)
		if err != nil {
			return nil
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	}
	return nil
}

// passwd keeps the host's system accounts (uid < 1000 and nobody, without
// any password field) and adds root and the sandbox's "user" (1000).
func passwd(path string) string {
	var b strings.Builder
	b.WriteString("root:x:0:0:root:/root:/bin/bash\n")
	for _, f := range systemEntries(path, 7) {
		if f[0] == "root" || f[0] == "user" {
			continue
		}
		f[1] = "x"
		b.WriteString(strings.Join(f, ":") + "\n")
	}
	b.WriteString("user:x:1000:1000:user:/home/user:/bin/bash\n")
	return b.String()
}

func group(path string) string {
	var b strings.Builder
	b.WriteString("root:x:0:\n")
	for _, f := range systemEntries(path, 4) {
		if f[0] == "root" || f[0] == "user" {
			continue
		}
		f[1], f[3] = "x", ""
		if f[0] == "sudo" {
			f[3] = "user"
		}
		b.WriteString(strings.Join(f, ":") + "\n")
	}
	b.WriteString("user:x:1000:\n")
	return b.String()
}

// systemEntries returns the colon-separated entries of a passwd-style file
// whose id (third field) is below 1000 or is 65534.
func systemEntries(path string, fields int) [][]string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out [][]string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) != fields {
			continue
		}
		var id int
		if _, err := fmt.Sscanf(f[2], "%d", &id); err != nil {
			continue
		}
		if id < 1000 || id == 65534 {
			out = append(out, f)
		}
	}
	return out
}

// DefaultEnv is the environment the host image gives its sandboxes'
// processes (PATH, LANG), for a host whose root is hostRoot. The bench
// gives its peers' processes the same, so that both run the same work.
func DefaultEnv(hostRoot string) []string {
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	if fi, err := os.Stat(filepath.Join(hostRoot, "usr/local/go/bin")); err == nil && fi.IsDir() {
		path += ":/usr/local/go/bin"
	}
	return []string{
		"PATH=" + path,
		"LANG=C.UTF-8",
	}
}

// digestTree hashes the names, modes, owners, link targets and contents of
// a tree, in a fixed order.
func digestTree(root string) (string, error) {
	h := sha256.New()
	io.WriteString(h, skeletonVersion+"\n")
	var paths []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(paths)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(root, p)
		fmt.Fprintf(h, "%s %o\n", rel, fi.Mode())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, _ := os.Readlink(p)
			fmt.Fprintf(h, "-> %s\n", t)
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
