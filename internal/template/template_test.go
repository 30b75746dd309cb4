package template

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

func TestParse(t *testing.T) {
	spec, err := Parse([]byte(`
name: web
warm: 2
steps:
  - run: make
  - copy: {src: app, dest: /srv/}
  - env: {A: "1"}
  - workdir: /srv
policy:
  allow: [example.com]
`))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Name != "web" || spec.Warm != 2 || len(spec.Steps) != 4 || spec.Steps[1].Copy.Dest != "/srv/" ||
		spec.Steps[2].Env["A"] != "1" || spec.Policy == nil || len(spec.Policy.Allow) != 1 {
		t.Fatalf("parsed %+v", spec)
	}
	if err := Check(&spec); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"name: x\nsteps:\n  - rn: true\n", "rn: unknown field"},
		{"name: x\nstep: []\n", "step: unknown field"},
		{"name: x\nwarm: many\n", "spec"},
		{"", "empty"},
		{"name: [\n", "spec"},
	} {
		if _, err := Parse([]byte(tc.yaml)); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): %v, want an invalid-argument error with %q", tc.yaml, err, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	content := "x"
	run := []api.TemplateStep{{Run: "true"}}
	for _, tc := range []struct {
		spec  api.TemplateSpec
		field string
	}{
		{api.TemplateSpec{Name: "", Steps: run}, "name"},
		{api.TemplateSpec{Name: "snap-abc", Steps: run}, "name"},
		{api.TemplateSpec{Name: "a/b", Steps: run}, "name"},
		{api.TemplateSpec{Name: "ok"}, "steps"},
		{api.TemplateSpec{Name: "ok", Warm: -1, Steps: run}, "warm"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{}}}, "steps[0]"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{Run: "a\x00"}}}, "steps[0].run"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{Copy: &api.TemplateCopy{Dest: "/x"}}}}, "steps[0].copy"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{Copy: &api.TemplateCopy{Src: "a", Content: &content, Dest: "/x"}}}}, "steps[0].copy"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{Copy: &api.TemplateCopy{Src: "/etc", Dest: "/x"}}}}, "steps[0].copy.src"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{Copy: &api.TemplateCopy{Src: "a/../..", Dest: "/x"}}}}, "steps[0].copy.src"},
		{api.TemplateSpec{Name: "ok", Steps: []api.TemplateStep{{Copy: &api.TemplateCopy{Content: &content, Dest: "/x/"}}}}, "steps[0].copy.dest"},
		// A group template: containers, and neither steps nor an image.
		{api.TemplateSpec{Name: "ok", Steps: run, Containers: []api.Container{{Name: "a"}}}, "steps"},
		{api.TemplateSpec{Name: "ok", Image: "host", Containers: []api.Container{{Name: "a"}}}, "image"},
		{api.TemplateSpec{Name: "ok", Steps: run, SharedVolumes: []api.SharedVolume{{Name: "w"}}}, "shared_volumes"},
		{api.TemplateSpec{Name: "ok", Warm: 65, Containers: []api.Container{{Name: "a"}}}, "warm"},
	} {
		if err := Check(&tc.spec); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("Check(%+v): %v, want an error naming %s", tc.spec, err, tc.field)
		}
	}
	if err := Check(&api.TemplateSpec{Name: "ok", Warm: 2, Containers: []api.Container{{Name: "a"}, {Name: "b", Image: "base"}}}); err != nil {
		t.Errorf("a group template: %v", err)
	}
}

type file struct {
	name, body string
	typ        byte
	link       string
}

func tarOf(t *testing.T, files []file, mod time.Time) io.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		typ := f.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		h := &tar.Header{Name: f.name, Typeflag: typ, Mode: 0o644, Size: int64(len(f.body)), Linkname: f.link, ModTime: mod}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			tw.Write([]byte(f.body))
		}
	}
	tw.Close()
	return &buf
}

func names(t *testing.T, tarball []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(tarball))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h.Name)
	}
}

func TestContextResolve(t *testing.T) {
	files := []file{
		{name: "paddock.yaml", body: "name: x"},
		{name: "app/", typ: tar.TypeDir},
		{name: "app/main.go", body: "package main"},
		{name: "./app/sub/x.txt", body: "x"},
		{name: "app/link", typ: tar.TypeSymlink, link: "main.go"},
		{name: "notes.txt", body: "n"},
	}
	c, spec, err := ReadContext(tarOf(t, files, time.Unix(1, 0)), "paddock.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(spec) != "name: x" {
		t.Fatalf("spec %q", spec)
	}
	content := "inline"
	for _, tc := range []struct {
		cp      api.TemplateCopy
		dir     string
		entries string
	}{
		{api.TemplateCopy{Src: "app", Dest: "/srv/app"}, "/srv/app", "link main.go sub/x.txt"},
		{api.TemplateCopy{Src: "./app/", Dest: "/srv/app/"}, "/srv/app", "link main.go sub/x.txt"},
		{api.TemplateCopy{Src: "notes.txt", Dest: "/etc/"}, "/etc", "notes.txt"},
		{api.TemplateCopy{Src: "notes.txt", Dest: "/etc/n.conf"}, "/etc", "n.conf"},
		{api.TemplateCopy{Content: &content, Dest: "/opt/f"}, "/opt", "f"},
		{api.TemplateCopy{Src: ".", Dest: "/all"}, "/all", "app/ app/link app/main.go app/sub/x.txt notes.txt"},
	} {
		put, err := c.Resolve(tc.cp)
		if err != nil {
			t.Fatalf("Resolve(%+v): %v", tc.cp, err)
		}
		var buf bytes.Buffer
		if err := put.WriteTar(&buf); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(names(t, buf.Bytes()), " "); put.Dir != tc.dir || got != tc.entries {
			t.Errorf("Resolve(%+v): dir %s, entries %q; want %s, %q", tc.cp, put.Dir, got, tc.dir, tc.entries)
		}
	}
	if _, err := c.Resolve(api.TemplateCopy{Src: "missing", Dest: "/x"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a missing source: %v", err)
	}

	// The content hash ignores times, and follows the bytes.
	hash := func(fs []file, mod time.Time) string {
		c, _, err := ReadContext(tarOf(t, fs, mod), "paddock.yaml")
		if err != nil {
			t.Fatal(err)
		}
		put, err := c.Resolve(api.TemplateCopy{Src: "app", Dest: "/srv"})
		if err != nil {
			t.Fatal(err)
		}
		return put.Hash
	}
	h1 := hash(files, time.Unix(1, 0))
	if h2 := hash(files, time.Unix(99999, 0)); h1 != h2 {
		t.Errorf("the hash changed with the times")
	}
	changed := append([]file(nil), files...)
	changed[2].body = "package other"
	if h3 := hash(changed, time.Unix(1, 0)); h3 == h1 {
		t.Errorf("the hash did not change with a file's bytes")
	}
}

func TestReadContextRefuses(t *testing.T) {
	for _, tc := range []struct {
		files []file
		want  string
	}{
		{[]file{{name: "../x", body: "x"}}, "leaves the build context"},
		{[]file{{name: "a/../../x", body: "x"}}, "leaves the build context"},
		{[]file{{name: "/etc/passwd", body: "x"}}, "relative"},
		{[]file{{name: "dev", typ: tar.TypeChar}}, "only files, directories and symlinks"},
		{[]file{{name: "h", typ: tar.TypeLink, link: "x"}}, "only files, directories and symlinks"},
		{[]file{{name: "link", typ: tar.TypeSymlink, link: "/etc"}, {name: "link/passwd", body: "x"}}, "under link, which is a symbolic link"},
		{[]file{{name: "a/b/c", body: "x"}, {name: "a", typ: tar.TypeSymlink, link: "/"}}, "under a, which is a symbolic link"},
		{[]file{{name: "f", body: "x"}, {name: "f/g", body: "x"}}, "under f, which is a file"},
	} {
		if _, _, err := ReadContext(tarOf(t, tc.files, time.Now()), "paddock.yaml"); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("context %+v: %v, want %q", tc.files, err, tc.want)
		}
	}
	big := []file{{name: "big", body: strings.Repeat("x", MaxContext+1)}}
	if _, _, err := ReadContext(tarOf(t, big, time.Now()), "paddock.yaml"); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("an oversized context: %v", err)
	}
}

func TestKeys(t *testing.T) {
	base := BaseKey("img1", nil)
	if base == BaseKey("img2", nil) || base == BaseKey("img1", &api.Policy{Presets: []string{"x"}}) {
		t.Fatal("the base key ignores the image or the policy")
	}
	a := StepKey(base, api.TemplateStep{Run: "make"}, "")
	if a != StepKey(base, api.TemplateStep{Run: "make"}, "") {
		t.Fatal("keys are not stable")
	}
	for _, other := range []string{
		StepKey(base, api.TemplateStep{Run: "make all"}, ""),
		StepKey(BaseKey("img2", nil), api.TemplateStep{Run: "make"}, ""),
		StepKey(base, api.TemplateStep{Run: "make"}, "digest"),
	} {
		if other == a {
			t.Fatal("a key ignores the step, its parent or its content")
		}
	}
}
