// Package template owns templates: their spec (paddock.yaml), the build
// context a spec copies files from, the cache keys of their steps, and
// their records. Building one (running its steps in a sandbox and
// capturing each step as a snapshot) is the sandbox manager's.
package template

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// MaxSteps bounds a template's steps.
const MaxSteps = 128

// MaxWarm bounds a template's warm pool.
const MaxWarm = 64

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// ValidName checks a template name.
func ValidName(name string) error {
	if !namePattern.MatchString(name) || strings.HasPrefix(name, "snap-") {
		return errdefs.Invalid("name", "%q is not a template name (1 to 64 of a-z 0-9 . _ -, starting with a letter or digit, not snap-)", trunc(name))
	}
	return nil
}

// Parse reads a spec from paddock.yaml (YAML, or JSON, which is YAML). Its
// keys are the JSON API's (name, image, steps, run, copy, ...); an unknown
// key is an error naming it.
func Parse(data []byte) (api.TemplateSpec, error) {
	var tree any
	if err := yaml.Unmarshal(data, &tree); err != nil {
		return api.TemplateSpec{}, errdefs.Invalid("spec", "%v", err)
	}
	if tree == nil {
		return api.TemplateSpec{}, errdefs.Invalid("spec", "empty")
	}
	// Through JSON, so that the wire types' names and checks apply.
	raw, err := json.Marshal(jsonable(tree))
	if err != nil {
		return api.TemplateSpec{}, errdefs.Invalid("spec", "%v", err)
	}
	return DecodeJSON(raw)
}

// DecodeJSON reads a spec in JSON, refusing unknown fields.
func DecodeJSON(raw []byte) (api.TemplateSpec, error) {
	var spec api.TemplateSpec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		msg := err.Error()
		if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
			return spec, errdefs.Invalid(strings.Trim(f, `"`), "unknown field")
		}
		return spec, errdefs.Invalid("spec", "%s", strings.TrimPrefix(msg, "json: "))
	}
	return spec, nil
}

// jsonable turns YAML's map[string]any trees (and any non-string keys)
// into what encoding/json accepts.
func jsonable(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			t[k] = jsonable(x)
		}
		return t
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			m[fmt.Sprint(k)] = jsonable(x)
		}
		return m
	case []any:
		for i, x := range t {
			t[i] = jsonable(x)
		}
		return t
	}
	return v
}

// Check validates what only this package knows of a spec: its name, its
// step shapes and its warm count. Paths and environment are checked by
// the caller with the sandbox rules.
func Check(spec *api.TemplateSpec) error {
	if err := ValidName(spec.Name); err != nil {
		return err
	}
	if len(spec.Containers) > 0 {
		// A group template: its containers are the spec; the sandbox
		// rules check them (the caller).
		switch {
		case len(spec.Steps) > 0:
			return errdefs.Invalid("steps", "a template of containers has no steps: give each container its image")
		case spec.Image != "":
			return errdefs.Invalid("image", "a template of containers has no image of its own: set each container's")
		}
	} else if len(spec.SharedVolumes) > 0 {
		return errdefs.Invalid("shared_volumes", "need containers to mount them")
	} else if len(spec.Steps) == 0 {
		return errdefs.Invalid("steps", "a template needs at least one step, or containers")
	}
	if len(spec.Steps) > MaxSteps {
		return errdefs.Invalid("steps", "more than %d steps", MaxSteps)
	}
	if spec.Warm < 0 || spec.Warm > MaxWarm {
		return errdefs.Invalid("warm", "%d is outside 0..%d", spec.Warm, MaxWarm)
	}
	for i, s := range spec.Steps {
		field := fmt.Sprintf("steps[%d]", i)
		n := 0
		if s.Run != "" {
			n++
			if strings.ContainsRune(s.Run, 0) {
				return errdefs.Invalid(field+".run", "contains a NUL byte")
			}
		}
		if s.Copy != nil {
			n++
			c := s.Copy
			if (c.Src == "") == (c.Content == nil) {
				return errdefs.Invalid(field+".copy", "needs exactly one of src and content")
			}
			if c.Dest == "" || !strings.HasPrefix(c.Dest, "/") {
				return errdefs.Invalid(field+".copy.dest", "%q must be an absolute path", trunc(c.Dest))
			}
			if c.Content != nil && strings.HasSuffix(c.Dest, "/") {
				return errdefs.Invalid(field+".copy.dest", "inline content needs a file path, not a directory")
			}
			if c.Src != "" {
				if _, err := ContextPath(c.Src); err != nil {
					return errdefs.Invalid(field+".copy.src", "%v", err)
				}
			}
		}
		if s.Env != nil {
			n++
		}
		if s.Workdir != "" {
			n++
		}
		if n != 1 {
			return errdefs.Invalid(field, "needs exactly one of run, copy, env and workdir (has %d)", n)
		}
	}
	return nil
}

// Action describes a step for the build log.
func Action(s api.TemplateStep) string {
	switch {
	case s.Run != "":
		return "run " + trunc(s.Run)
	case s.Copy != nil && s.Copy.Src != "":
		return "copy " + s.Copy.Src + " " + s.Copy.Dest
	case s.Copy != nil:
		return "copy (inline) " + s.Copy.Dest
	case s.Env != nil:
		keys := make([]string, 0, len(s.Env))
		for k := range s.Env {
			keys = append(keys, k)
		}
		return "env " + strings.Join(sorted(keys), " ")
	}
	return "workdir " + s.Workdir
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
