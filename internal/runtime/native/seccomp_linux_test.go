package native

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/guestapi"
)

// TestSandboxFilter: a sandbox's commands run under the seccomp filter
// whether its guest loads it whole or its forker loaded the split
// filter's base and the guest its tail (two filters then), with the fast
// guest and the Go guest: the calls the tail decides (unshare, mount,
// pivot_root) are refused, the others work.
func TestSandboxFilter(t *testing.T) {
	fast := fastGuest(t)
	probe := `grep '^Seccomp' /proc/self/status
unshare -U true 2>/dev/null; echo unshare=$?
mount -t tmpfs none /tmp 2>/dev/null; echo mount=$?
python3 -c 'import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
r = libc.pivot_root(b"/tmp", b"/tmp")
print("pivot_root", os.strerror(ctypes.get_errno()) if r else "ok")
print("socket", __import__("socket").socket().fileno() > 2)'`
	for _, tc := range []struct {
		name    string
		fast    string
		split   bool
		filters string
	}{
		{"whole/fast", fast, false, "1"},
		{"whole/go", "", false, "1"},
		{"split/fast", fast, true, "2"},
		{"split/go", "", true, "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			guest, _ := guestInstance(t, tc.fast, tc.split)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, c, err := guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"sh", "-c", probe}, Env: []string{"PATH=/usr/bin:/bin"}})
			if err != nil {
				t.Fatal(err)
			}
			out, errs, st := readStream(t, c, "")
			c.Release()
			want := "Seccomp:\t2\nSeccomp_filters:\t" + tc.filters + "\nunshare=1\nmount=32\npivot_root Operation not permitted\nsocket True\n"
			if out != want || st == nil || st.ExitCode != 0 {
				t.Fatalf("under the filter:\n%s\nwant:\n%s\nstderr: %s, status %+v", out, want, strings.TrimSpace(errs), st)
			}
		})
	}
}
