package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/paddock-dev/paddock/internal/guestbin"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// The guest binary a sandbox runs is bound into it from the host, and a
// memory checkpoint holds the pages the sentry mapped of it: a restore
// must bind the very same bytes, or the guest runs on half one binary,
// half another (and crashes). So the binaries are kept by content: each
// is RunDir/gvisor/guests/<sha256>, written once and never replaced
// (a daemon writes its own at start if it is not there), and a
// checkpoint carries a copy of the one its sandbox runs (guestCopyName,
// ~4 MB, beside the pack: the restore binds it before the pack is
// mounted) with its sum (guestSumName). A restore binds the store's file
// of that sum, put back from the copy when the store lacks it (RunDir on
// a tmpfs, after a reboot); a checkpoint whose copy is gone too is
// unusable. A start prunes the store's binaries no bundle binds.
const (
	guestsName    = "guests"
	guestCopyName = "guest"
	guestSumName  = "guest.sha256"
	// legacyGuest is where daemons before the store wrote their guest
	// (anew at each start); sandboxes they started still bind it.
	legacyGuest = "paddock-guest"
)

// storeGuest copies the guest binary src into store dir under its
// sha256, unless a file of that sum is there already, and returns its
// path and sum. want, if set, is the sum it must have.
func storeGuest(dir string, src io.Reader, want string) (path, sum string, err error) {
	tmp, err := os.CreateTemp(dir, ".guest-*")
	if err != nil {
		return "", "", err
	}
	defer os.Remove(tmp.Name())
	sum, err = copyHashed(tmp, src)
	if err == nil {
		err = tmp.Chmod(0o555)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", "", err
	}
	if want != "" && sum != want {
		return "", "", fmt.Errorf("its sha256 is %s, not %s", sum, want)
	}
	path = filepath.Join(dir, sum)
	if _, err := os.Stat(path); err == nil {
		return path, sum, nil
	}
	return path, sum, os.Rename(tmp.Name(), path)
}

// copyHashed copies src to dst and returns the sha256 of what it copied.
func copyHashed(dst io.Writer, src io.Reader) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(dst, h), src); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeGuest stores the guest binary this daemon starts sandboxes with
// (path, or the embedded one: guestbin.Open) in store dir and returns
// its path there.
func writeGuest(dir, path string) (string, error) {
	src, err := guestbin.Open(path)
	if err != nil {
		return "", err
	}
	defer src.Close()
	p, _, err := storeGuest(dir, src, "")
	return p, err
}

// bundle is sandbox id's OCI spec, as its bundle holds it.
func (r *Runtime) bundle(id string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(r.dir(id), "config.json"))
	if err != nil {
		return nil, err
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("reading the sandbox's bundle: %w", err)
	}
	return &spec, nil
}

// boundGuest is the host file sandbox id's bundle binds as its guest.
func (r *Runtime) boundGuest(id string) (string, error) {
	spec, err := r.bundle(id)
	if err != nil {
		return "", err
	}
	for _, m := range spec.Mounts {
		if m.Destination == guestExe {
			return m.Source, nil
		}
	}
	return "", errors.New("the sandbox's bundle binds no guest binary")
}

// keepGuest copies the guest binary sandbox id runs into checkpoint
// directory dir, with its sum; unsynced (the caller syncs the
// checkpoint).
func (r *Runtime) keepGuest(id, dir string) error {
	src, err := r.boundGuest(id)
	if err != nil {
		return fmt.Errorf("finding the sandbox's guest binary: %w", err)
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("finding the sandbox's guest binary: %w", err)
	}
	defer in.Close()
	out, err := createNew(filepath.Join(dir, guestCopyName))
	if err != nil {
		return err
	}
	sum, err := copyHashed(out, in)
	closeNew(out, &err)
	if err != nil {
		return fmt.Errorf("copying the guest binary: %w", err)
	}
	if filepath.Dir(src) == r.guests() && filepath.Base(src) != sum {
		// The store's file is not what its name says: nothing of it
		// can be trusted to restore.
		return fmt.Errorf("the guest binary %s has sha256 %s", src, sum)
	}
	return os.WriteFile(filepath.Join(dir, guestSumName), []byte(sum+"\n"), 0o600)
}

// checkpointGuest is the guest binary checkpoint directory image must
// be restored with: the store's file of the sum it names, put back from
// its copy if need be. One taken before checkpoints named theirs gets
// this daemon's. A checkpoint whose binary is gone or damaged is
// runtime.ErrCheckpointUnusable.
func (r *Runtime) checkpointGuest(image string) (string, error) {
	b, err := os.ReadFile(filepath.Join(image, guestSumName))
	if errors.Is(err, fs.ErrNotExist) {
		r.log.Warn("a checkpoint names no guest binary (taken by an earlier version): restoring it with this daemon's", "checkpoint", image)
		return r.guest, nil
	}
	if err != nil {
		return "", fmt.Errorf("%w: reading its guest binary's sum: %v", runtime.ErrCheckpointUnusable, err)
	}
	sum := strings.TrimSpace(string(b))
	if !isSum(sum) {
		return "", fmt.Errorf("%w: it names no guest binary (%.80q)", runtime.ErrCheckpointUnusable, sum)
	}
	p := filepath.Join(r.guests(), sum)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	in, err := os.Open(filepath.Join(image, guestCopyName))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%w: the guest binary it was taken with (sha256 %s) is gone: neither its copy in the checkpoint nor %s is there",
			runtime.ErrCheckpointUnusable, sum, p)
	}
	if err != nil {
		return "", fmt.Errorf("%w: opening its guest binary: %v", runtime.ErrCheckpointUnusable, err)
	}
	defer in.Close()
	p, _, err = storeGuest(r.guests(), in, sum)
	if err != nil {
		return "", fmt.Errorf("%w: its copy of the guest binary it was taken with is damaged: %v", runtime.ErrCheckpointUnusable, err)
	}
	return p, nil
}

func isSum(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func (r *Runtime) guests() string { return filepath.Join(r.root, guestsName) }

// pruneGuests removes the guest binaries of the store (and an earlier
// daemon's legacyGuest) that no sandbox's bundle binds, but keep: a
// paused sandbox's checkpoint carries its own copy. It runs at start,
// before any sandbox does.
func (r *Runtime) pruneGuests(keep string) {
	bound := map[string]bool{keep: true}
	bundles, _ := filepath.Glob(filepath.Join(r.cfg.RunDir, "sandboxes", "*", "config.json"))
	for _, b := range bundles {
		if p, err := r.boundGuest(filepath.Base(filepath.Dir(b))); err == nil {
			bound[p] = true
		}
	}
	candidates := []string{filepath.Join(r.root, legacyGuest)}
	entries, _ := os.ReadDir(r.guests())
	for _, e := range entries {
		candidates = append(candidates, filepath.Join(r.guests(), e.Name()))
	}
	for _, p := range candidates {
		if bound[p] {
			continue
		}
		if err := os.Remove(p); err == nil {
			r.log.Debug("removed a guest binary no sandbox binds", "path", p)
		}
	}
}
