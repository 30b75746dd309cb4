package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/storage/image"
)

// guestRuntime is a Runtime with only what the guest store needs: its
// run dir and a store holding binary, which new sandboxes bind.
func guestRuntime(t *testing.T, binary string) *Runtime {
	t.Helper()
	run := t.TempDir()
	r := &Runtime{cfg: Config{RunDir: run}, log: slog.New(slog.DiscardHandler), root: filepath.Join(run, "gvisor")}
	if err := os.MkdirAll(r.guests(), 0o700); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "guest")
	if err := os.WriteFile(src, []byte(binary), 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	if r.guest, err = writeGuest(r.guests(), src); err != nil {
		t.Fatal(err)
	}
	return r
}

// bindGuest writes sandbox id's bundle, binding guest.
func bindGuest(t *testing.T, r *Runtime, id, guest string) {
	t.Helper()
	if err := os.MkdirAll(r.dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(bundleSpec(bundle{id: id, guest: guest, image: &image.Image{}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir(id), "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestGuestStore: a checkpoint carries the guest binary its sandbox runs
// and is restored with it by a daemon whose own guest differs, after its
// store was lost (a reboot's tmpfs) or not; a checkpoint whose binary is
// gone or damaged is unusable, saying why; one that names none gets the
// daemon's; a start prunes the binaries no bundle binds.
func TestGuestStore(t *testing.T) {
	old := guestRuntime(t, "old guest")
	if sum := sha256.Sum256([]byte("old guest")); filepath.Base(old.guest) != hex.EncodeToString(sum[:]) {
		t.Fatalf("the store names its binary %s, not by its sha256", old.guest)
	}
	again, err := writeGuest(old.guests(), old.guest)
	if err != nil || again != old.guest {
		t.Fatalf("storing the same binary again: %s, %v; want %s", again, err, old.guest)
	}
	bindGuest(t, old, "sb", old.guest)
	ck := filepath.Join(t.TempDir(), "checkpoint")
	if err := os.Mkdir(ck, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := old.keepGuest("sb", ck); err != nil {
		t.Fatal(err)
	}

	// A daemon with another guest, its store without the old one.
	r := guestRuntime(t, "new guest")
	if r.guest == old.guest || filepath.Base(r.guest) == filepath.Base(old.guest) {
		t.Fatal("two guests share a name")
	}
	for round := range 2 {
		p, err := r.checkpointGuest(ck)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != "old guest" || filepath.Base(p) != filepath.Base(old.guest) {
			t.Fatalf("round %d: the checkpoint restores with %s (%q); want the old guest", round, p, b)
		}
	}

	// A store file not what its name says is refused.
	bindGuest(t, r, "liar", filepath.Join(r.guests(), filepath.Base(r.guest)))
	os.Chmod(r.guest, 0o644)
	if err := os.WriteFile(r.guest, []byte("tampered"), 0o555); err != nil {
		t.Fatal(err)
	}
	if err := r.keepGuest("liar", t.TempDir()); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("keeping a guest binary whose content is not its name: %v", err)
	}

	for _, tc := range []struct {
		name  string
		spoil func(dir string) error
		want  string
	}{
		{"gone", func(dir string) error { return os.Remove(filepath.Join(dir, guestCopyName)) }, "is gone"},
		{"damaged", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, guestCopyName), []byte("old guesT"), 0o600)
		}, "damaged"},
		{"no sum", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, guestSumName), []byte("../../etc/passwd\n"), 0o600)
		}, "names no guest binary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fresh := guestRuntime(t, "new guest")
			dir := filepath.Join(t.TempDir(), "checkpoint")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{guestCopyName, guestSumName} {
				b, _ := os.ReadFile(filepath.Join(ck, name))
				os.WriteFile(filepath.Join(dir, name), b, 0o600)
			}
			if err := tc.spoil(dir); err != nil {
				t.Fatal(err)
			}
			_, err := fresh.checkpointGuest(dir)
			if !errors.Is(err, runtime.ErrCheckpointUnusable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restoring: %v; want unusable, %q", err, tc.want)
			}
			if entries, _ := os.ReadDir(fresh.guests()); len(entries) != 1 {
				t.Fatalf("the store holds %d files; want the daemon's only", len(entries))
			}
		})
	}

	legacy := t.TempDir()
	if p, err := r.checkpointGuest(legacy); err != nil || p != r.guest {
		t.Fatalf("a checkpoint that names no guest binary restores with %s, %v; want the daemon's %s", p, err, r.guest)
	}

	// Pruning keeps what bundles bind and the daemon's own.
	legacyPath := filepath.Join(r.root, legacyGuest)
	os.WriteFile(legacyPath, []byte("older daemon's"), 0o555)
	os.WriteFile(filepath.Join(r.guests(), ".guest-123"), nil, 0o600)
	restored := filepath.Join(r.guests(), filepath.Base(old.guest))
	bindGuest(t, r, "restored", restored)
	os.Remove(filepath.Join(r.dir("liar"), "config.json"))
	r.pruneGuests(r.guest)
	entries, _ := os.ReadDir(r.guests())
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if len(left) != 2 || !slices.Contains(left, filepath.Base(old.guest)) || !slices.Contains(left, filepath.Base(r.guest)) {
		t.Fatalf("after pruning the store holds %v; want the daemon's and the restored sandbox's", left)
	}
	if _, err := os.Stat(legacyPath); err == nil {
		t.Fatal("pruning kept an earlier daemon's guest binary no bundle binds")
	}
}
