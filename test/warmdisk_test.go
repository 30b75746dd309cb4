package test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// TestRestartBurstKeepsWarmDisks: the daemon is killed with SIGKILL during
// a burst of creates and started again, several times. The restarted
// daemon starts refilling its warm pool while it re-attaches the
// sandboxes it finds; the warm guests it makes meanwhile are its own, and
// their disks (warm-<id>) must not be removed as leftovers of sandboxes
// nobody recorded (issue 20.7: the next create then failed with "moving
// guest disk: not found"). After each restart every warm guest has its
// disk, creates succeed, and no disk belongs to nobody. One sandbox's
// guest is stopped (SIGSTOP) across each restart, so that re-attaching it
// waits for its ping to time out: the window in which the pool refills
// before the leftovers are listed is then seconds wide, not the
// milliseconds a busy host gives by chance (2 of 8 restarts in the issue).
func TestRestartBurstKeepsWarmDisks(t *testing.T) {
	t.Parallel()
	const warm = 3
	d := newDaemon(t, "--warm-guests", "3")
	small := api.CreateRequest{Resources: api.Resources{CPUs: 0.1, MemoryBytes: 128 << 20}}
	// Sandboxes that live through every restart: re-attaching them is
	// what the restarted daemon does while its pool refills.
	for range 4 {
		d.Create(small)
	}
	create := func(n int, timeout time.Duration) (ids []string, errs []error) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				sb, err := d.Client().Create(ctx, small)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				ids = append(ids, sb.ID)
			}()
		}
		wg.Wait()
		return ids, errs
	}
	const rounds = 5
	for round := range rounds {
		stuck := d.get(d.Create(small)).Runtime.HostPID
		// A burst, killed in the middle.
		done := make(chan struct{})
		go func() {
			defer close(done)
			create(6, 30*time.Second)
		}()
		time.Sleep(time.Duration(50+round*40) * time.Millisecond)
		d.Kill9()
		<-done
		if err := syscall.Kill(stuck, syscall.SIGSTOP); err != nil {
			t.Fatalf("stopping a guest: %v", err)
		}
		d.Start()

		// Every warm guest gets its disk (one being made has its run
		// dir a moment before its disk).
		if missing := waitWarmDisks(d, 15*time.Second); len(missing) > 0 {
			t.Errorf("round %d: warm guests without their disk after the restart: %v", round, missing)
		}
		ids, errs := create(warm, time.Minute)
		for _, err := range errs {
			t.Errorf("round %d: create after the restart: %v", round, err)
		}
		for _, id := range ids {
			if out := d.Sh(id, "echo ok > /tmp/f && cat /tmp/f"); out != "ok\n" {
				t.Errorf("round %d: sandbox %s: %q", round, id, out)
			}
		}
		if left := strayDisks(d, 15*time.Second); len(left) > 0 {
			t.Errorf("round %d: disks no sandbox or warm guest owns: %v", round, left)
		}
		if t.Failed() {
			return
		}
		// Keep the survivors few: the burst's and this round's go.
		list, err := d.Client().List(t.Context(), client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i, sb := range list {
			if i >= 4 || sb.State != api.StateRunning {
				d.MustCLI("rm", "-f", sb.ID)
			}
		}
	}
}

// warmGuests lists the ids of the daemon's warm guests by their run dirs.
func warmGuests(d *Daemon) []string {
	var ids []string
	entries, _ := os.ReadDir(filepath.Join(d.RunDir, "warm"))
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids
}

// diskNames lists the handed-out disks of the daemon's sandbox disk pool.
func diskNames(d *Daemon) []string {
	var names []string
	entries, _ := os.ReadDir(filepath.Join(d.StateDir, "storage", "disks", "vol"))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// waitWarmDisks waits until every warm guest has its disk and returns
// those that still have none.
func waitWarmDisks(d *Daemon, timeout time.Duration) []string {
	var missing []string
	waitFor(timeout, 50*time.Millisecond, func() bool {
		missing = missing[:0]
		disks := diskNames(d)
		for _, id := range warmGuests(d) {
			if !slices.Contains(disks, warmDiskName+id) {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0
	})
	return missing
}

// strayDisks waits until every handed-out disk belongs to a listed
// sandbox or a warm guest, and returns those that still do not.
func strayDisks(d *Daemon, timeout time.Duration) []string {
	var stray []string
	waitFor(timeout, 100*time.Millisecond, func() bool {
		stray = stray[:0]
		list, err := d.Client().List(context.Background(), client.ListOptions{})
		if err != nil {
			return false
		}
		warm := warmGuests(d)
		for _, name := range diskNames(d) {
			id, isWarm := strings.CutPrefix(name, warmDiskName)
			switch {
			case isWarm && slices.Contains(warm, id):
			case !isWarm && slices.ContainsFunc(list, func(sb api.Sandbox) bool { return sb.ID == name }):
			default:
				stray = append(stray, name)
			}
		}
		return len(stray) == 0
	})
	return stray
}
