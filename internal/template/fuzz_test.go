package template

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"path"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// FuzzParse: any paddock.yaml parses to a spec or to an ErrInvalid
// naming what was wrong (never a panic or another category); a spec that
// passes Check has copy sources that stay in the build context, and
// reads back the same through the JSON API's decoder.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"name: web\nwarm: 2\nsteps:\n  - run: make\n  - copy: {src: app, dest: /srv/}\n  - env: {A: \"1\"}\n  - workdir: /srv\npolicy:\n  allow: [example.com]\n",
		"name: x\nsteps:\n  - copy: {src: ../../etc/passwd, dest: /x}\n",
		"name: x\nsteps:\n  - copy: {src: /etc/passwd, dest: /x}\n",
		"name: x\nsteps:\n  - copy: {content: \"hi\", dest: /x, mode: 0755}\n",
		"{\"name\": \"x\", \"steps\": [{\"run\": \"true\"}]}",
		"name: x\nsteps: &a [*a]\n",
		"a: &a [*a, *a, *a]\nb: &b [*a, *a]\n",
		"? [1, 2]\n: x\n",
		"name: x\nsteps:\n  - {run: a, env: {B: c}}\n",
		"",
		"!!binary aGk=",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := Parse(data)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("Parse: %v is not ErrInvalid", err)
			}
			return
		}
		if err := Check(&spec); err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("Check: %v is not ErrInvalid", err)
			}
			return
		}
		for _, s := range spec.Steps {
			if s.Copy == nil || s.Copy.Src == "" {
				continue
			}
			src, err := ContextPath(s.Copy.Src)
			if err != nil || path.IsAbs(src) || src == ".." || strings.HasPrefix(src, "../") {
				t.Fatalf("copy.src %q passed Check as %q, %v", s.Copy.Src, src, err)
			}
		}
		raw, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeJSON(raw)
		if err != nil {
			t.Fatalf("the spec does not read back: %v\n%s", err, raw)
		}
		if raw2, _ := json.Marshal(again); !bytes.Equal(raw, raw2) {
			t.Fatalf("the spec changed on reading back:\n%s\n%s", raw, raw2)
		}
	})
}

// FuzzReadContext: any build context (a tar) is read or refused as the
// caller's fault; what is read has only clean relative names under
// directories, and a copy step resolves only to its entries.
func FuzzReadContext(f *testing.F) {
	for _, files := range [][]file{
		{{name: "app/main.go", body: "package main"}, {name: "app", typ: tar.TypeDir}},
		{{name: "link", typ: tar.TypeSymlink, link: "/etc"}, {name: "link/passwd", body: "x"}},
		{{name: "../x", body: "x"}},
		{{name: "/abs", body: "x"}},
		{{name: "paddock.yaml", body: "name: x\n"}, {name: "a/./b/../c", body: "y"}},
	} {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, e := range files {
			typ := e.typ
			if typ == 0 {
				typ = tar.TypeReg
			}
			tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: typ, Linkname: e.link, Mode: 0o644, Size: int64(len(e.body))})
			tw.Write([]byte(e.body))
		}
		tw.Close()
		f.Add(b.Bytes(), "app")
	}
	f.Fuzz(func(t *testing.T, data []byte, src string) {
		c, _, err := ReadContext(bytes.NewReader(data), "paddock.yaml")
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrTooLarge) {
				t.Fatalf("ReadContext: %v is neither ErrInvalid nor ErrTooLarge", err)
			}
			return
		}
		for name := range c.entries {
			if clean, err := ContextPath(name); err != nil || clean != name || name == "." {
				t.Fatalf("entry %q kept (clean %q, %v)", name, clean, err)
			}
		}
		put, err := c.Resolve(api.TemplateCopy{Src: src, Dest: "/dest/"})
		if err != nil {
			return
		}
		for _, e := range put.entries {
			if strings.HasPrefix(e.name, "/") || e.name == ".." || strings.HasPrefix(e.name, "../") || strings.Contains(e.name, "/../") {
				t.Fatalf("copy %q puts %q", src, e.name)
			}
		}
		var out bytes.Buffer
		if err := put.WriteTar(&out); err != nil {
			t.Fatalf("writing the copy's tar: %v", err)
		}
	})
}
