package archive_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/paddock-dev/paddock/internal/archive"
	"github.com/paddock-dev/paddock/internal/archive/s3test"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

func openStore(t *testing.T, srv *s3test.Server) *archive.Store {
	t.Helper()
	st, err := archive.Open(archive.Config{Endpoint: srv.Endpoint, Bucket: "test", AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey, PartSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStoreRoundTripAndDamage(t *testing.T) {
	srv := s3test.Start(t)
	st := openStore(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// 12 MiB of incompressible data in a 64 MiB image: three parts.
	img := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(64 << 20)
	data := make([]byte, 12<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>13)
	}
	f.WriteAt(data, 10<<20)
	f.Close()

	const id = "abc123def456"
	d, err := st.PutDisk(ctx, id, archive.FirstDisk, img)
	if err != nil {
		t.Fatal(err)
	}
	if d.Size != 64<<20 || d.Data < 12<<20 || d.Bytes == 0 {
		t.Fatalf("disk %+v", d)
	}
	if err := st.Put(ctx, archive.Record{ID: id, Sandbox: []byte(`{"id":"` + id + `"}`), Node: "n1", Disk: &d}); err != nil {
		t.Fatal(err)
	}
	rec, err := st.Get(ctx, id)
	if err != nil || rec.Disk == nil || *rec.Disk != d || rec.Node != "n1" {
		t.Fatalf("record %+v, %v", rec, err)
	}
	restore := func(d archive.Disk) error {
		out, err := os.Create(filepath.Join(t.TempDir(), "restored.img"))
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		if err := st.GetDisk(ctx, id, archive.FirstDisk, d, out); err != nil {
			return err
		}
		want, _ := os.ReadFile(img)
		got, _ := os.ReadFile(out.Name())
		if !bytes.Equal(want, got) {
			t.Fatal("the restored disk differs")
		}
		return nil
	}
	if err := restore(d); err != nil {
		t.Fatal(err)
	}
	// A record whose checksum does not match: refused, nothing kept.
	bad := d
	bad.SHA256 = "00" + d.SHA256[2:]
	if err := restore(bad); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a checksum mismatch: %v", err)
	}

	// The object truncated behind the archive's back.
	mc, err := minio.New(srv.Endpoint[len("http://"):], &minio.Options{Creds: credentials.NewStaticV4(s3test.AccessKey, s3test.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	obj, err := mc.GetObject(ctx, "test", "sandboxes/"+id+"/disk", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var whole bytes.Buffer
	if _, err := whole.ReadFrom(obj); err != nil {
		t.Fatal(err)
	}
	half := whole.Bytes()[:whole.Len()/2]
	if _, err := mc.PutObject(ctx, "test", "sandboxes/"+id+"/disk", bytes.NewReader(half), int64(len(half)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	err = restore(d)
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a truncated disk: %v", err)
	}
	t.Log(err)

	if _, err := st.Get(ctx, "zzz000000000"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an id never archived: %v", err)
	}
	if err := st.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}

	// The store down: a clear error naming it.
	srv.Stop()
	sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
	defer scancel()
	if _, err := st.PutDisk(sctx, id, archive.FirstDisk, img); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("store down: %v", err)
	} else {
		t.Log(err)
	}
}

// TestClaim: of many nodes claiming one archived sandbox at once, exactly
// one wins (a conditional write the store arbitrates) and the others are
// told which; a released claim can be taken again; a restored sandbox
// answers a MovedError naming its node; a claim older than ClaimTTL is
// taken over.
func TestClaim(t *testing.T) {
	srv := s3test.Start(t)
	st := openStore(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id = "abc123claim0"
	d := archive.Disk{Bytes: 1, SHA256: "00", Size: 1, Data: 1}
	if err := st.Put(ctx, archive.Record{ID: id, Sandbox: []byte(`{}`), Node: "n0", Disk: &d}); err != nil {
		t.Fatal(err)
	}

	const racers = 8
	var wg sync.WaitGroup
	won := make(chan *archive.Claimed, racers)
	errs := make(chan error, racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := st.Claim(ctx, id, fmt.Sprintf("n%d", i+1))
			if err != nil {
				errs <- err
				return
			}
			won <- c
		}()
	}
	wg.Wait()
	close(won)
	close(errs)
	if len(won) != 1 {
		t.Fatalf("%d of %d claims won", len(won), racers)
	}
	c := <-won
	for err := range errs {
		if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "being resumed") {
			t.Fatalf("a losing claim: %v", err)
		}
	}
	t.Logf("winner %s", c.Claim.Node)
	// The winner's own retry renews its claim; another node is refused.
	if _, err := st.Claim(ctx, id, "other"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), c.Claim.Node) {
		t.Fatalf("a claim against a live one: %v", err)
	}
	if err := st.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	c2, err := st.Claim(ctx, id, "n9")
	if err != nil {
		t.Fatalf("a claim after a release: %v", err)
	}
	// A claim whose holder's write went stale cannot end the restore.
	if err := st.Restored(ctx, c); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Restored with a released claim: %v", err)
	}
	if err := st.Restored(ctx, c2); err != nil {
		t.Fatal(err)
	}
	var mv *errdefs.MovedError
	if _, err := st.Claim(ctx, id, "n1"); !errors.As(err, &mv) || mv.Node != "n9" || !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a claim of a restored sandbox: %v", err)
	}

	// A claim left by a node that died restoring: taken over after
	// ClaimTTL.
	old := archive.Record{ID: id, Sandbox: []byte(`{}`), Node: "n9", Disk: &d,
		Claim: &archive.Claim{Node: "dead", At: time.Now().Add(-archive.ClaimTTL - time.Second)}}
	if err := st.Put(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Claim(ctx, id, "n2"); err != nil {
		t.Fatalf("taking over an expired claim: %v", err)
	}
}

// TestGroupDisks: a sandbox of several containers archives a disk per
// container and per shared volume beside the first's; each comes back
// whole, the record names them all, a restore deletes every disk and
// keeps the record, and a delete removes everything. Object names that
// are not a disk's are refused before the store is called.
func TestGroupDisks(t *testing.T) {
	srv := s3test.Start(t)
	st := openStore(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const id = "abc123group0"
	dir := t.TempDir()
	objects := []string{archive.FirstDisk, archive.ContainerDisk("tools"), archive.ContainerDisk("db-1"), archive.SharedDisk("workspace")}
	disks := map[string]archive.Disk{}
	for i, obj := range objects {
		img := filepath.Join(dir, obj+".img")
		if err := os.WriteFile(img, bytes.Repeat([]byte{byte(i + 1)}, 1<<20+i), 0o600); err != nil {
			t.Fatal(err)
		}
		d, err := st.PutDisk(ctx, id, obj, img)
		if err != nil {
			t.Fatal(err)
		}
		disks[obj] = d
	}
	first := disks[archive.FirstDisk]
	rec := archive.Record{ID: id, Sandbox: []byte(`{}`), Node: "n1", Disk: &first,
		Containers: map[string]archive.Disk{"tools": disks[archive.ContainerDisk("tools")], "db-1": disks[archive.ContainerDisk("db-1")]},
		Shared:     map[string]archive.Disk{"workspace": disks[archive.SharedDisk("workspace")]}}
	if err := st.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	got, err := st.Get(ctx, id)
	if err != nil || len(got.Containers) != 2 || got.Containers["db-1"] != rec.Containers["db-1"] || got.Shared["workspace"] != rec.Shared["workspace"] {
		t.Fatalf("record %+v, %v", got, err)
	}
	for i, obj := range objects {
		out, err := os.Create(filepath.Join(dir, obj+".out"))
		if err != nil {
			t.Fatal(err)
		}
		err = st.GetDisk(ctx, id, obj, disks[obj], out)
		out.Close()
		if err != nil {
			t.Fatalf("%s: %v", obj, err)
		}
		if b, _ := os.ReadFile(out.Name()); !bytes.Equal(b, bytes.Repeat([]byte{byte(i + 1)}, 1<<20+i)) {
			t.Fatalf("%s came back different", obj)
		}
	}
	// One disk's record swapped for another's: the checksum tells.
	out, _ := os.Create(filepath.Join(dir, "swapped.out"))
	err = st.GetDisk(ctx, id, archive.ContainerDisk("tools"), disks[archive.ContainerDisk("db-1")], out)
	out.Close()
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "container-tools disk") {
		t.Fatalf("a disk with another's record: %v", err)
	}
	for _, bad := range []string{"../disk", "container-", "container-../x", "shared-A", "record.json", "other"} {
		if _, err := st.PutDisk(ctx, id, bad, filepath.Join(dir, "disk.img")); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("PutDisk of object %q: %v", bad, err)
		}
	}

	mc, err := minio.New(srv.Endpoint[len("http://"):], &minio.Options{Creds: credentials.NewStaticV4(s3test.AccessKey, s3test.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	keys := func() []string {
		var out []string
		for o := range mc.ListObjects(ctx, "test", minio.ListObjectsOptions{Prefix: "sandboxes/" + id + "/", Recursive: true}) {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			out = append(out, strings.TrimPrefix(o.Key, "sandboxes/"+id+"/"))
		}
		return out
	}
	if k := keys(); len(k) != 5 {
		t.Fatalf("objects %v, want 4 disks and the record", k)
	}
	c, err := st.Claim(ctx, id, "n2")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Restored(ctx, c); err != nil {
		t.Fatal(err)
	}
	if k := keys(); len(k) != 1 || k[0] != "record.json" {
		t.Fatalf("objects after the restore: %v, want the record only", k)
	}
	if got, err := st.Get(ctx, id); err != nil || got.Disk != nil || got.Containers != nil || got.Shared != nil || got.Node != "n2" {
		t.Fatalf("record after the restore: %+v, %v", got, err)
	}
	if _, err := st.PutDisk(ctx, id, archive.SharedDisk("workspace"), filepath.Join(dir, "disk.img")); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if k := keys(); len(k) != 0 {
		t.Fatalf("objects after delete: %v", k)
	}
}
