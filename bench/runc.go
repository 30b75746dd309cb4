package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// runcRig runs runc containers from prepared bundles. Everything it makes
// is private: its state root, its bundles and rootfs under dir, and the
// cgroups under cgroupParent.
type runcRig struct {
	bin          string
	dir          string
	stateRoot    string // runc --root
	rootfs       string
	cgroupParent string
	base         []byte       // config.json as `runc spec` wrote it
	seq          atomic.Int64 // the churn loops make ids concurrently
}

// prepareRunc builds the shared rootfs (mount points and the /bin, /lib
// symlinks; /usr is bind-mounted read-only by config.json) and takes the
// default spec from `runc spec`.
func prepareRunc(ctx context.Context, bin, dir, cgroupParent string) (*runcRig, error) {
	r := &runcRig{
		bin:          bin,
		dir:          dir,
		stateRoot:    filepath.Join(dir, "state"),
		rootfs:       filepath.Join(dir, "rootfs"),
		cgroupParent: cgroupParent,
	}
	if err := os.MkdirAll(filepath.Join(r.rootfs, "usr"), 0o755); err != nil {
		return nil, fmt.Errorf("making runc rootfs: %w", err)
	}
	for _, l := range [][2]string{{"usr/bin", "bin"}, {"usr/lib", "lib"}, {"usr/lib64", "lib64"}, {"usr/sbin", "sbin"}} {
		if err := os.Symlink(l[0], filepath.Join(r.rootfs, l[1])); err != nil {
			return nil, fmt.Errorf("making runc rootfs: %w", err)
		}
	}
	tmpl := filepath.Join(dir, "template")
	if err := os.MkdirAll(tmpl, 0o755); err != nil {
		return nil, fmt.Errorf("making runc template: %w", err)
	}
	if _, err := output(ctx, bin, "spec", "--bundle", tmpl); err != nil {
		return nil, err
	}
	base, err := os.ReadFile(filepath.Join(tmpl, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("reading runc spec: %w", err)
	}
	r.base = base
	return r, nil
}

// newID returns a container id unique within this run.
func (r *runcRig) newID(kind string) string {
	return fmt.Sprintf("bench-%s-%d", kind, r.seq.Add(1))
}

// bundle writes the bundle for container id running args and returns its
// directory. It is outside every timed region.
func (r *runcRig) bundle(id string, args []string) (string, error) {
	var s specs.Spec
	if err := json.Unmarshal(r.base, &s); err != nil {
		return "", fmt.Errorf("decoding runc spec: %w", err)
	}
	if s.Process == nil || s.Linux == nil {
		return "", errors.New("runc spec has no process or linux section")
	}
	editSpec(&s, r.rootfs, args, "/"+r.cgroupParent+"/"+id)
	b, err := json.MarshalIndent(&s, "", "\t")
	if err != nil {
		return "", fmt.Errorf("encoding runc spec: %w", err)
	}
	dir := filepath.Join(r.dir, "bundles", id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("making bundle: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		return "", fmt.Errorf("writing bundle: %w", err)
	}
	return dir, nil
}

// editSpec turns runc's default spec into the peer of a paddock sandbox on
// the host image: the host's /usr read-only, a private /tmp, no terminal,
// the default namespaces (pid, network, ipc, uts, mount) plus cgroup, and
// a sandbox's environment (peerEnv).
func editSpec(s *specs.Spec, rootfs string, args []string, cgroupsPath string) {
	s.Process.Terminal = false
	s.Process.Args = args
	s.Process.Env = peerEnv()
	s.Root = &specs.Root{Path: rootfs, Readonly: true}
	s.Hostname = "bench"
	s.Mounts = append(s.Mounts,
		specs.Mount{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
	)
	if !slices.ContainsFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.CgroupNamespace }) {
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.CgroupNamespace})
	}
	s.Linux.CgroupsPath = cgroupsPath
}

// argv is a runc command line on the private state root.
func (r *runcRig) argv(args ...string) []string {
	return append([]string{r.bin, "--root", r.stateRoot}, args...)
}

// exists reports whether runc still knows container id.
func (r *runcRig) exists(id string) bool {
	_, err := os.Stat(filepath.Join(r.stateRoot, id))
	return err == nil
}

// remove deletes container id if runc still knows it, and its bundle.
func (r *runcRig) remove(ctx context.Context, id string) error {
	var err error
	if r.exists(id) {
		_, err = output(ctx, r.argv("delete", "--force", id)...)
	}
	if rerr := os.RemoveAll(filepath.Join(r.dir, "bundles", id)); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

// cleanup deletes every container left on the state root and reports
// them: none should be.
func (r *runcRig) cleanup(ctx context.Context) (left []string, err error) {
	ents, rerr := os.ReadDir(r.stateRoot)
	if rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		return nil, fmt.Errorf("listing runc containers: %w", rerr)
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		left = append(left, e.Name())
		if _, err := output(ctx, r.argv("delete", "--force", e.Name())...); err != nil {
			errs = append(errs, err)
		}
	}
	return left, errors.Join(errs...)
}

// version is runc's first --version line.
func (r *runcRig) version(ctx context.Context) string {
	out, err := output(ctx, r.bin, "--version")
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(out, "\n")
	return line
}
