package test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// seedMounts lists the read-only mounts of template images the daemon
// keeps under its disks' pool directory (seeds).
func seedMounts(t *testing.T, d *Daemon) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	pool := filepath.Join(d.StateDir, "storage", "disks", "pool") + "/"
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && strings.HasPrefix(f[4], pool) && strings.HasPrefix(f[5], "ro") {
			out = append(out, f[4])
		}
	}
	return out
}

// TestTemplateSeededDisks: sandboxes of a small template, the first with
// a clone of its image and the next with its files mirrored into ready
// disks (a seed), see the same tree through their overlay: a file the
// build removed from the image stays removed, a directory it replaced
// hides the image's, and owners, modes, hard and symbolic links, FIFOs
// and times are kept. The seed is unmounted with the template.
func TestTemplateSeededDisks(t *testing.T) {
	t.Parallel()
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	build := strings.Join([]string{
		"set -e",
		"mkdir -p /opt/s/d /opt/s/e",
		"printf 'one\\n' > /opt/s/d/f",
		"chmod 4750 /opt/s/d/f",
		"chown 1000:1000 /opt/s/e",
		"chmod 1777 /opt/s/e",
		"ln /opt/s/d/f /opt/s/hl",
		"ln -s ../../etc/passwd /opt/s/sl",
		"mkfifo /opt/s/fifo",
		"touch -d '2020-01-02 03:04:05' /opt/s/d/f /opt/s/d",
		"rm /etc/shadow",
		"rm -rf /var && mkdir /var && touch /var/only",
	}, "\n")
	if _, err := c.BuildTemplate(ctx, api.TemplateSpec{Name: "seeded", Steps: []api.TemplateStep{{Run: build}}}, nil); err != nil {
		t.Fatal(err)
	}
	look := "stat -c '%n %f %u:%g %s %h %Y' /opt/s /opt/s/d /opt/s/d/f /opt/s/e /opt/s/hl /opt/s/sl /opt/s/fifo; " +
		"readlink /opt/s/sl; cat /opt/s/hl; test -e /etc/shadow || echo no-shadow; ls -A /var; ls -A /etc | wc -l"
	var first string
	for i := range 4 {
		sb, err := c.Create(ctx, api.CreateRequest{From: "seeded"})
		if err != nil {
			t.Fatal(err)
		}
		out, errOut, st := d.Exec(sb.ID, "sh", "-c", look)
		if st == nil || st.ExitCode != 0 {
			t.Fatalf("sandbox %d: %v: %s", i, st, errOut)
		}
		if i == 0 {
			first = out
			for _, want := range []string{
				"/opt/s/d/f 89e8 0:0 4 2 1577934245\n", // setuid 0750, two names, its time
				"/opt/s/d 41ed 0:0",
				"/opt/s/e 43ff 1000:1000",
				"/opt/s/fifo 11a4 0:0",
				"\n../../etc/passwd\none\nno-shadow\nonly\n",
			} {
				if !strings.Contains(out, want) {
					t.Fatalf("the template's first sandbox shows\n%s\nwithout %q", out, want)
				}
			}
		} else if out != first {
			t.Errorf("sandbox %d of the template shows\n%s\nthe first showed\n%s", i, out, first)
		}
		if err := c.Delete(ctx, sb.ID, true); err != nil {
			t.Fatal(err)
		}
		// The next create finds a ready disk to mirror into.
		if !waitFor(10*time.Second, 20*time.Millisecond, func() bool {
			p, err := c.Pools(ctx)
			return err == nil && p.Ready["image:host"] >= 1
		}) {
			t.Fatal("the default pool did not refill")
		}
	}
	if seeds := seedMounts(t, d); len(seeds) != 1 {
		t.Fatalf("seed mounts after four sandboxes of the template: %v, want one\n%s", seeds, d.Log())
	}
	if strings.Contains(d.Log(), "mirroring a seed failed") {
		t.Fatalf("a mirror failed:\n%s", d.Log())
	}
	if err := c.DeleteTemplate(ctx, "seeded"); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool { return len(seedMounts(t, d)) == 0 }) {
		t.Fatalf("the seed is still mounted after its template was removed: %v", seedMounts(t, d))
	}
}
