package guest

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
)

func TestFileXattrs(t *testing.T) {
	g := startFileGuest(t)
	ctx := fileCtx(t)
	want := map[string]string{"user.e2b.owner": "me", "user.e2b.tag": "v1"}
	end, err := g.c.WriteFile(ctx, guestapi.FileRequest{Path: "/workspace/a", Xattrs: want, XattrPrefix: "user.e2b."}, strings.NewReader("alpha"))
	if err != nil {
		if strings.Contains(err.Error(), "not supported") {
			t.Skipf("the test directory keeps no user xattrs: %v", err)
		}
		t.Fatal(err)
	}
	if !maps.Equal(end.Info.Xattrs, want) {
		t.Fatalf("write answered %v, want %v", end.Info.Xattrs, want)
	}
	// Set from the side, as a process in the sandbox would; only the
	// prefix asked for comes back, and only when asked.
	if err := unix.Setxattr(g.host("workspace/a"), "user.other", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	fi, err := g.c.Stat(ctx, guestapi.FileRequest{Path: "/workspace/a", XattrPrefix: "user.e2b."})
	if err != nil || !maps.Equal(fi.Xattrs, want) {
		t.Fatalf("stat: %v %v", fi, err)
	}
	if fi, _ := g.c.Stat(ctx, guestapi.FileRequest{Path: "/workspace/a"}); fi.Xattrs != nil {
		t.Fatalf("stat without a prefix answered %v", fi.Xattrs)
	}
	ls, err := g.c.ListDir(ctx, guestapi.FileRequest{Path: "/workspace", XattrPrefix: "user.e2b."})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := ls.Next()
	ls.Close()
	if err != nil || len(batch) != 1 || !maps.Equal(batch[0].Xattrs, want) {
		t.Fatalf("list: %v %v", batch, err)
	}
	moved, err := g.c.Move(ctx, guestapi.FileRequest{Path: "/workspace/a", To: "/workspace/b", XattrPrefix: "user.e2b."})
	if err != nil || !maps.Equal(moved.Xattrs, want) {
		t.Fatalf("move: %v %v", moved, err)
	}
	// An overwrite is a new file: the old set is gone.
	end, err = g.c.WriteFile(ctx, guestapi.FileRequest{Path: "/workspace/b", XattrPrefix: "user."}, strings.NewReader("beta"))
	if err != nil || end.Info.Xattrs != nil {
		t.Fatalf("overwrite kept %v (%v)", end.Info.Xattrs, err)
	}

	for _, fr := range []guestapi.FileRequest{
		{Path: "/workspace/c", Xattrs: map[string]string{"trusted.x": "1"}},
		{Path: "/workspace/c", Xattrs: map[string]string{"security.capability": "1"}},
		{Path: "/workspace/c", Xattrs: map[string]string{"user.overlay.opaque": "y"}},
		{Path: "/workspace/c", Xattrs: map[string]string{"user.": "1"}},
		{Path: "/workspace/c", Xattrs: map[string]string{"user.big": strings.Repeat("v", maxXattrValue+1)}},
		{Path: "/workspace/c", XattrPrefix: "trusted."},
	} {
		if _, err := g.c.WriteFile(ctx, fr, strings.NewReader("c")); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("write %v: %v, want invalid", fr, err)
		}
	}
	if err := unix.Lstat(g.host("workspace/c"), &unix.Stat_t{}); err == nil {
		t.Error("a refused write left a file")
	}
}
