package e2b

import (
	"fmt"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
)

func TestMountFSType(t *testing.T) {
	info := []byte(`22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/l
23 22 0:22 / /proc rw - proc proc rw
24 22 0:40 / /mnt/share rw shared:5 - nfs4 host:/export rw,vers=4.2
25 24 0:41 / /mnt/share/local rw - tmpfs tmpfs rw
26 22 0:42 / /home/user/my\040drive rw - fuse.sshfs me@h:/ rw
27 22 0:43 / /mnt/sharp rw - ext4 /dev/vdb rw
garbage line
`)
	for _, tc := range []struct {
		dir, want string
		network   bool
	}{
		{"/", "overlay", false},
		{"/home/user", "overlay", false},
		{"/mnt/share", "nfs4", true},
		{"/mnt/share/deep/er", "nfs4", true},
		{"/mnt/share/local/x", "tmpfs", false},
		{"/mnt/sharp", "ext4", false}, // a prefix of the name is not a parent
		{"/home/user/my drive/x", "fuse.sshfs", true},
	} {
		got := mountFSType(info, tc.dir)
		if got != tc.want || isNetworkFS(got) != tc.network {
			t.Errorf("mountFSType(%q) = %q (network %v), want %q (%v)", tc.dir, got, isNetworkFS(got), tc.want, tc.network)
		}
	}
	if got := mountFSType(nil, "/x"); got != "" {
		t.Errorf("no mountinfo: %q", got)
	}
}

func TestDiffListings(t *testing.T) {
	t0 := time.Unix(1000, 0)
	f := func(p, typ string, size int64, mtime time.Time, mode api.FileMode) api.FileInfo {
		return api.FileInfo{Path: p, Type: typ, Size: size, ModTime: mtime, Mode: mode}
	}
	old := map[string]api.FileInfo{
		"/d/a":   f("/d/a", api.TypeFile, 1, t0, 0o644),
		"/d/b":   f("/d/b", api.TypeFile, 1, t0, 0o644),
		"/d/c":   f("/d/c", api.TypeFile, 1, t0, 0o644),
		"/d/sub": f("/d/sub", api.TypeDir, 4096, t0, 0o755),
		"/d/e":   f("/d/e", api.TypeFile, 1, t0, 0o644),
	}
	now := map[string]api.FileInfo{
		"/d/a":   f("/d/a", api.TypeFile, 2, t0, 0o644),                  // grew
		"/d/b":   f("/d/b", api.TypeFile, 1, t0.Add(time.Second), 0o644), // touched
		"/d/sub": f("/d/sub", api.TypeDir, 4096, t0.Add(time.Second), 0o700),
		"/d/e":   f("/d/e", api.TypeDir, 1, t0, 0o644), // replaced by a directory
		"/d/new": f("/d/new", api.TypeFile, 0, t0, 0o644),
	}
	var got []string
	for _, e := range diffListings(old, now, t0) {
		got = append(got, fmt.Sprintf("%s %s %v", e.Type, e.Path, e.IsDir))
	}
	want := []string{
		api.EventRemove + " /d/c false",
		api.EventWrite + " /d/a false",
		api.EventWrite + " /d/b false",
		api.EventCreate + " /d/e true",
		api.EventCreate + " /d/new false",
		api.EventChmod + " /d/sub true",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("diffListings:\n got %v\nwant %v", got, want)
	}
	if len(diffListings(now, now, t0)) != 0 {
		t.Error("no change, yet events")
	}
}
