package test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// layerDirs lists a daemon's unpacked OCI layers and anything else in the
// layer directory (an unpack left half-done would show as .tmp-*).
func layerDirs(t *testing.T, d *Daemon) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(d.StateDir, "images", "oci", "layers"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func imageNames(t *testing.T, d *Daemon) []string {
	t.Helper()
	list, err := d.Client().Images(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, img := range list {
		out = append(out, img.Name)
	}
	return out
}

// TestImageImportRun imports a `docker save` archive and an OCI layout
// built from host files, runs commands in sandboxes made from them (the
// image's env and workdir, whiteouts and opaque directories as the layers
// say, the daemon's own resolv.conf over the image's symlink), checks
// that the two images store their shared layer once, and that an image
// cannot be removed while a sandbox uses it.
func TestImageImportRun(t *testing.T) {
	fx := buildImages(t)
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()

	// Import through the CLI, which streams the file and reports progress.
	r := d.CLI("image", "import", "--name", "e2e/app:v1", dockerSave(t, fx.app, "ignored/name:v0"))
	if r.Code != 0 || !strings.Contains(r.Stderr, "imported e2e/app:v1: 2 layers") {
		t.Fatalf("image import: exit %d\nstdout: %s\nstderr: %s\n%s", r.Code, r.Stdout, r.Stderr, d.Log())
	}
	wantID, _ := fx.app.ConfigName()
	if got := strings.TrimSpace(r.Stdout); got != wantID.String() {
		t.Fatalf("import printed %q, want the config digest %s", got, wantID)
	}
	ls := d.MustCLI("image", "ls")
	if !strings.Contains(ls, "host") || !strings.Contains(ls, "e2e/app:v1") {
		t.Fatalf("image ls:\n%s", ls)
	}

	id := d.createCLI("--image", "e2e/app:v1")
	sb := d.get(id)
	if sb.Image != "e2e/app:v1" || sb.ImageID != wantID.String() || sb.Workdir != "/app" {
		t.Fatalf("sandbox: image %q id %q workdir %q", sb.Image, sb.ImageID, sb.Workdir)
	}
	// The guest is PID 1 in a root that has no paddock binary and no
	// /proc, /dev or /etc/hosts of its own.
	out := d.Sh(id, `cat /app/hello.txt; echo "pwd=$(pwd) greeting=$GREETING path=$PATH"; cat /etc/os-release
for f in /data/keep.txt /data/link.txt /data/gone.txt /data/olddir/old.txt /data/olddir/new.txt; do
  if [ -e $f ]; then echo "$f present"; else echo "$f absent"; fi
done
cat /data/link.txt; read first < /etc/resolv.conf; echo "$first"`)
	for _, want := range []string{
		"hello from the image\n",
		"pwd=/app greeting=hello-env path=/bin\n",
		"ID=paddock-e2e\n",
		"/data/keep.txt present\n", "/data/link.txt present\n",
		"/data/gone.txt absent\n", "/data/olddir/old.txt absent\n", "/data/olddir/new.txt present\n",
		"kept\n",
		"# paddock",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("sandbox output lacks %q:\n%s", want, out)
		}
	}
	// Commands run as root: the image's User is reported, not applied.
	if out := d.Sh(id, `echo uid=$(cat /proc/self/status | while read k v rest; do [ "$k" = Uid: ] && echo $v; done)`); out != "uid=0\n" {
		t.Errorf("default user: %q", out)
	}
	// Writes land in the sandbox's own layer, never in the shared one.
	d.Sh(id, "echo changed > /data/keep.txt; echo x > /data/gone.txt")
	if out := d.Sh(id, "cat /data/keep.txt /data/gone.txt"); out != "changed\nx\n" {
		t.Fatalf("after writes: %q", out)
	}
	for _, l := range layerDirs(t, d) {
		b, err := os.ReadFile(filepath.Join(d.StateDir, "images", "oci", "layers", l, "root", "data", "keep.txt"))
		if err == nil && string(b) != "kept\n" {
			t.Fatalf("layer %s was written through: %q", l, b)
		}
	}
	if n := len(layerDirs(t, d)); n != 2 {
		t.Fatalf("layers after one import: %v", layerDirs(t, d))
	}

	// An OCI layout of a second image sharing the base layer, through the
	// SDK: the shared layer is stored once.
	other, err := c.ImportImage(ctx, bytes.NewReader(ociLayoutTar(t, fx.other, "e2e/other:oci")), "")
	if err != nil {
		t.Fatalf("importing an OCI layout: %v", err)
	}
	if other.Name != "e2e/other:oci" || other.Layers != 2 || other.Digest != digestOf(t, fx.other) {
		t.Fatalf("imported: %+v", other)
	}
	if dirs := layerDirs(t, d); len(dirs) != 3 {
		t.Fatalf("two images of 2 layers sharing one: %d layer dirs %v, want 3", len(dirs), dirs)
	}
	// --from takes an image too.
	id2 := d.createCLI("--from", "e2e/other:oci")
	if out := d.Sh(id2, "cat /srv/other.txt /data/gone.txt; echo $GREETING; pwd"); out != "other image\nshould be whited out\nother\n/\n" {
		t.Fatalf("sandbox of the second image: %q", out)
	}

	// A fork and a snapshot of it keep the exact image.
	d.Sh(id2, "echo forked > /srv/mine.txt")
	fork := strings.TrimSpace(d.MustCLI("fork", id2))
	if sb := d.get(fork); sb.ImageID != other.ID || sb.Image != "e2e/other:oci" {
		t.Fatalf("fork: image %q id %q, want %s", sb.Image, sb.ImageID, other.ID)
	}
	if out := d.Sh(fork, "cat /srv/mine.txt /srv/other.txt"); out != "forked\nother image\n" {
		t.Fatalf("fork sees %q", out)
	}
	snap, err := c.Snapshot(ctx, id2, api.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, fork, true); err != nil {
		t.Fatal(err)
	}

	// Not removable while a sandbox uses it; the error names the user.
	r = d.CLI("image", "rm", "e2e/app:v1")
	if r.Code == 0 || !strings.Contains(r.Stderr, "in use") || !strings.Contains(r.Stderr, id) {
		t.Fatalf("image rm while in use: exit %d, %s", r.Code, r.Stderr)
	}
	err = c.DeleteImage(ctx, wantID.String())
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusConflict {
		t.Fatalf("delete by id while in use: %v", err)
	}
	img, err := c.GetImage(ctx, "e2e/app:v1")
	if err != nil || len(img.UsedBy) != 1 || img.UsedBy[0] != "sandbox "+id || img.Config.User != "1234" {
		t.Fatalf("inspect: %+v, %v", img, err)
	}
	if err := c.DeleteImage(ctx, "host"); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("removing the host image: %v", err)
	}
	// A stopped sandbox still holds its image: it can be started again.
	if _, err := c.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if r := d.CLI("image", "rm", "e2e/app:v1"); r.Code == 0 {
		t.Fatal("image of a paused sandbox was removed")
	}
	if _, err := c.Resume(ctx, id); err != nil {
		t.Fatalf("resume: %v\n%s", err, d.Log())
	}
	if out := d.Sh(id, "cat /data/keep.txt /app/hello.txt"); out != "changed\nhello from the image\n" {
		t.Fatalf("after resume: %q", out)
	}
	if err := c.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	d.MustCLI("image", "rm", "e2e/app:v1")
	// The base layer stays for the other image; the top layer went.
	if dirs := layerDirs(t, d); len(dirs) != 2 {
		t.Fatalf("after removing one image: %v", dirs)
	}
	if err := c.Delete(ctx, id2, true); err != nil {
		t.Fatal(err)
	}
	// The snapshot still holds the image: a sandbox can be made from it.
	if r := d.CLI("image", "rm", "e2e/other:oci"); r.Code == 0 || !strings.Contains(r.Stderr, "snapshot "+snap.ID) {
		t.Fatalf("image rm while a snapshot holds it: exit %d, %s", r.Code, r.Stderr)
	}
	fromSnap := d.Create(api.CreateRequest{From: snap.ID})
	if out := d.Sh(fromSnap, "cat /srv/mine.txt"); out != "forked\n" {
		t.Fatalf("sandbox from the snapshot sees %q", out)
	}
	if err := c.Delete(ctx, fromSnap, true); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	d.MustCLI("image", "rm", "e2e/other:oci")
	if dirs := layerDirs(t, d); len(dirs) != 0 {
		t.Fatalf("after removing both images: %v", dirs)
	}
	if names := imageNames(t, d); len(names) != 1 || names[0] != "host" {
		t.Fatalf("images left: %v", names)
	}
	// host stays the default.
	if sb := d.get(d.createCLI()); sb.Image != "host" {
		t.Fatalf("default image: %q", sb.Image)
	}
}

// TestImagePull pulls from a registry served in-process on loopback:
// credentials (basic and a bearer token), a digest pin that holds even
// when the tag moves, plain-HTTP rules, and a corrupt blob that is
// refused with a clear error and leaves nothing behind.
func TestImagePull(t *testing.T) {
	fx := buildImages(t)
	reg := startRegistry(t)
	appRef := reg.push(t, "team/app:v1", fx.app)
	appDigest := digestOf(t, fx.app)
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	reg.set(func(r *e2eRegistry) { r.user, r.password, r.token = "alice", "s3cret", "tok-123" })

	// Plain HTTP must be asked for, and only loopback registries get it.
	_, err := c.PullImage(ctx, api.PullRequest{Reference: appRef}, nil)
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "plain HTTP") {
		t.Fatalf("pull over HTTP without insecure: %v", err)
	}
	_, err = c.PullImage(ctx, api.PullRequest{Reference: "registry.example.invalid/app:v1", Insecure: true}, nil)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusBadRequest || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("insecure pull from a remote registry: %v", err)
	}
	// Credentials.
	_, err = c.PullImage(ctx, api.PullRequest{Reference: appRef, Insecure: true}, nil)
	if !errors.Is(err, client.ErrDenied) || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("anonymous pull from a registry that wants credentials: %v", err)
	}
	_, err = c.PullImage(ctx, api.PullRequest{Reference: appRef, Insecure: true, Username: "alice", Password: "wrong"}, nil)
	if !errors.Is(err, client.ErrDenied) {
		t.Fatalf("pull with a wrong password: %v", err)
	}
	// The CLI, with the password on stdin, reports progress.
	r := d.CLIInput("s3cret\n", "image", "pull", "--insecure", "-u", "alice", "--password-stdin", appRef)
	if r.Code != 0 || !strings.Contains(r.Stderr, "resolving "+appRef) || !strings.Contains(r.Stderr, "pulled "+appRef+": 2 layers") {
		t.Fatalf("image pull: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	wantID, _ := fx.app.ConfigName()
	if strings.TrimSpace(r.Stdout) != wantID.String() {
		t.Fatalf("pull printed %q, want %s", r.Stdout, wantID)
	}
	if strings.Contains(d.Log(), "s3cret") {
		t.Fatal("the registry password reached the daemon's log")
	}
	img, err := c.GetImage(ctx, appRef)
	if err != nil || img.Digest != appDigest || len(img.RepoDigests) != 1 || img.RepoDigests[0] != reg.host+"/team/app@"+appDigest {
		t.Fatalf("pulled image: %+v %v", img, err)
	}
	id := d.Create(api.CreateRequest{Image: appRef})
	if out := d.Sh(id, "cat /app/hello.txt"); out != "hello from the image\n" {
		t.Fatalf("sandbox of a pulled image: %q", out)
	}

	// A digest pin: the tag moves to another image, the pin still gets
	// the pinned one, with a bearer token this time.
	reg.set(func(r *e2eRegistry) { r.user, r.token = "", "" })
	reg.push(t, "team/app:v1", fx.other)
	reg.set(func(r *e2eRegistry) { r.token = "tok-123" })
	var events []api.PullEvent
	pinned, err := c.PullImage(ctx, api.PullRequest{Reference: reg.host + "/team/app:v1", Digest: appDigest, Insecure: true, Token: "tok-123"},
		func(e api.PullEvent) { events = append(events, e) })
	if err != nil {
		t.Fatalf("pinned pull: %v", err)
	}
	if pinned.ID != wantID.String() || pinned.Name != reg.host+"/team/app:v1" {
		t.Fatalf("pinned pull got %+v", pinned)
	}
	if len(events) < 2 || events[0].Status != "resolving" || events[len(events)-1].Image == nil {
		t.Fatalf("progress events: %+v", events)
	}
	_, err = c.PullImage(ctx, api.PullRequest{Reference: reg.host + "/team/app:v1", Digest: "sha256:" + strings.Repeat("0", 64), Insecure: true, Token: "tok-123"}, nil)
	if !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("pull pinned to a digest the registry lacks: %v", err)
	}
	_, err = c.PullImage(ctx, api.PullRequest{Reference: appRef, Digest: "sha256:nothex", Insecure: true}, nil)
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("pull with a malformed digest: %v", err)
	}

	// A corrupt blob: refused, naming the blob; no image and no layer left.
	before := layerDirs(t, d)
	beforeNames := imageNames(t, d)
	extraDigest, _ := fx.extra.Digest()
	reg.set(func(r *e2eRegistry) { r.damaged = extraDigest.String() })
	_, err = c.PullImage(ctx, api.PullRequest{Reference: reg.host + "/team/app:v1", Insecure: true, Token: "tok-123"}, nil)
	if !errors.As(err, &ce) || ce.Status != http.StatusBadRequest || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), extraDigest.Hex[:12]) {
		t.Fatalf("pull of a corrupt blob: %v", err)
	}
	if after := layerDirs(t, d); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("layer dirs after a corrupt pull: %v, before %v", after, before)
	}
	if after := imageNames(t, d); strings.Join(after, ",") != strings.Join(beforeNames, ",") {
		t.Fatalf("images after a corrupt pull: %v, before %v", after, beforeNames)
	}
	tmp, _ := os.ReadDir(filepath.Join(d.StateDir, "images", "oci", "tmp"))
	if len(tmp) != 0 {
		t.Fatalf("spooled files left: %v", tmp)
	}
	// The same pull succeeds once the registry serves the blob intact.
	reg.set(func(r *e2eRegistry) { r.damaged = "" })
	if _, err := c.PullImage(ctx, api.PullRequest{Reference: reg.host + "/team/app:v1", Insecure: true, Token: "tok-123"}, nil); err != nil {
		t.Fatalf("pull after the registry was repaired: %v", err)
	}
	if err := c.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
}

// TestImageImportCorrupt: archives whose layer blob was damaged (an OCI
// layout, whose blobs have digests, and a `docker save` archive, whose
// layers have only diff IDs) are refused with a clear error and leave
// nothing behind.
func TestImageImportCorrupt(t *testing.T) {
	fx := buildImages(t)
	d := StartDaemon(t)
	saved, err := os.ReadFile(dockerSave(t, fx.app, "e2e/app:v1"))
	if err != nil {
		t.Fatal(err)
	}
	baseDigest, _ := fx.base.Digest()
	for _, tc := range []struct {
		name, entry string
		archive     []byte
	}{
		{"oci-layout", "blobs/sha256/" + baseDigest.Hex, ociLayoutTar(t, fx.app, "e2e/app:v1")},
		{"docker-save", baseDigest.Hex + ".tar.gz", saved},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := bytes.Clone(tc.archive)
			// The entry's name opens its 512-byte header; its contents
			// follow. Damage them a little way in.
			i := bytes.Index(raw, []byte(tc.entry+"\x00"))
			if i < 0 {
				t.Fatalf("archive has no entry %s", tc.entry)
			}
			raw[i+512+4096] ^= 0xff
			_, err := d.Client().ImportImage(context.Background(), bytes.NewReader(raw), "e2e/app:v1")
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Status != http.StatusBadRequest || !strings.Contains(err.Error(), "corrupt") {
				t.Fatalf("import of a corrupt archive: %v", err)
			}
			t.Logf("refused: %v", err)
			if dirs := layerDirs(t, d); len(dirs) != 0 {
				t.Fatalf("layers left by a corrupt import: %v", dirs)
			}
			if names := imageNames(t, d); len(names) != 1 {
				t.Fatalf("images after a corrupt import: %v", names)
			}
		})
	}
	// The undamaged archive imports.
	if _, err := d.Client().ImportImage(context.Background(), bytes.NewReader(saved), "e2e/app:v1"); err != nil {
		t.Fatalf("import of the intact archive: %v", err)
	}
}

// TestImageImportLimit: an archive past the daemon's import limit is
// refused with 413 while it streams in, and a bad name with 400 naming it.
func TestImageImportLimit(t *testing.T) {
	fx := buildImages(t)
	d := StartDaemon(t, "--image-import-limit", "512k")
	f, err := os.Open(dockerSave(t, fx.app, "e2e/app:v1"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = d.Client().ImportImage(context.Background(), f, "")
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusRequestEntityTooLarge || !strings.Contains(err.Error(), "larger than 524288 bytes") {
		t.Fatalf("import past the limit: %v", err)
	}
	if tmp, _ := os.ReadDir(filepath.Join(d.StateDir, "images", "oci", "tmp")); len(tmp) != 0 {
		t.Fatalf("spooled files left: %v", tmp)
	}
	for _, bad := range []string{"host", "Bad Name", "e2e/app:v1:v2"} {
		_, err = d.Client().ImportImage(context.Background(), strings.NewReader("not read"), bad)
		if !errors.As(err, &ce) || ce.Status != http.StatusBadRequest || !strings.Contains(err.Error(), "name") {
			t.Errorf("import as %q: %v", bad, err)
		}
	}
	if r := d.do("POST", "/v1/images/import", "not a tar"); r.Status != http.StatusBadRequest {
		t.Errorf("import of a non-archive: %d %s", r.Status, r.Body)
	}
	if r := d.do("GET", "/v1/images/inspect", ""); r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), "name") {
		t.Errorf("inspect without a name: %d %s", r.Status, r.Body)
	}
	if r := d.do("DELETE", "/v1/images?name=nosuch/image", ""); r.Status != http.StatusNotFound {
		t.Errorf("rm of an unknown image: %d %s", r.Status, r.Body)
	}
}

// TestImageBare: an image of programs and libraries only (no /etc, /tmp,
// /proc or /dev) on a daemon without networking runs: the guest makes
// every mount target and its /etc/hostname in the sandbox's own layer.
func TestImageBare(t *testing.T) {
	layer := gzLayer(t, layerBytes(t, hostProgramEntries(t, map[string]string{"bin/sh": "/bin/sh", "bin/cat": "/bin/cat"})))
	img := withConfig(t, layer, gzLayer(t, layerBytes(t, []tarEntry{{name: "README", mode: 0o644, body: []byte("bare\n")}})), v1.Config{})
	d := StartDaemon(t, "--no-network")
	if _, err := d.Client().ImportImage(context.Background(), bytes.NewReader(ociLayoutTar(t, img, "e2e/bare:1")), ""); err != nil {
		t.Fatal(err)
	}
	id := d.createCLI("--image", "e2e/bare:1")
	out := d.Sh(id, `cat /README /etc/hostname; echo "$PATH"; pwd; [ -c /dev/null ] && echo dev-ok`)
	if want := "bare\n" + id + "\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n/\ndev-ok\n"; out != want {
		t.Fatalf("bare image sandbox: %q, want %q", out, want)
	}
	for _, l := range layerDirs(t, d) {
		if _, err := os.Lstat(filepath.Join(d.StateDir, "images", "oci", "layers", l, "root", "etc")); err == nil {
			t.Fatalf("layer %s gained an /etc", l)
		}
	}
}

// TestImageHostileMetadata: an image the sandbox cannot be made from is
// the caller's fault, answered 400 naming what is wrong, not 500: a
// capability xattr the kernel refuses (at import), and a symbolic link
// where the sandbox mounts /run/paddock (at create).
func TestImageHostileMetadata(t *testing.T) {
	d := StartDaemon(t)
	ctx := context.Background()
	progs := hostProgramEntries(t, map[string]string{"bin/sh": "/bin/sh"})

	var capLayer bytes.Buffer
	tw := tar.NewWriter(&capLayer)
	tw.WriteHeader(&tar.Header{Name: "bin/ping", Typeflag: tar.TypeReg, Mode: 0o755, Size: 1, Format: tar.FormatPAX,
		PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "not a capability"}})
	tw.Write([]byte("x"))
	tw.Close()
	img := withConfig(t, gzLayer(t, layerBytes(t, progs)), gzLayer(t, capLayer.Bytes()), v1.Config{})
	_, err := d.Client().ImportImage(ctx, bytes.NewReader(ociLayoutTar(t, img, "e2e/badcap:1")), "")
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "security.capability") || !strings.Contains(err.Error(), "bin/ping") {
		t.Errorf("importing a bad capability: %v; want invalid_argument naming bin/ping and security.capability", err)
	}

	for tag, target := range map[string]string{"e2e/runlink:1": "/etc", "e2e/runlink:2": "/nowhere"} {
		img = withConfig(t, gzLayer(t, layerBytes(t, progs)), gzLayer(t, layerBytes(t, []tarEntry{
			{name: "run/paddock", typ: tar.TypeSymlink, linkname: target},
		})), v1.Config{})
		if _, err := d.Client().ImportImage(ctx, bytes.NewReader(ociLayoutTar(t, img, tag)), ""); err != nil {
			t.Fatal(err)
		}
		_, err = d.Client().Create(ctx, api.CreateRequest{Image: tag})
		if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "/run/paddock") {
			t.Errorf("a sandbox of %s (/run/paddock -> %s): %v; want invalid_argument naming /run/paddock", tag, target, err)
		}
	}
}
