package server

import (
	"cmp"
	"io"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/gateway"
)

// TestOpenAPICoversRoutes keeps api/openapi.yaml true to the router: every
// route is documented, and every documented operation is routed.
func TestOpenAPICoversRoutes(t *testing.T) {
	f, err := os.Open("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	documented := map[string]bool{}
	var inSandbox []string
	for path, item := range loadOpenAPI(t).Paths {
		if len(item.Servers) > 0 && item.Servers[0].URL == clusterGateway {
			continue // served by a cluster's gateway (internal/router), not by this router
		}
		if slices.Contains(servedAhead, path) {
			continue
		}
		if len(item.Servers) > 0 {
			// Served to sandboxes by the egress gateway, not by this router.
			if item.Servers[0].URL != "http://"+gateway.SelfHost {
				t.Errorf("%s: servers %+v, want http://%s", path, item.Servers, gateway.SelfHost)
			}
			inSandbox = append(inSandbox, path)
			continue
		}
		for method := range item.Ops {
			if slices.Contains([]string{"get", "put", "post", "delete", "options", "head", "patch"}, method) {
				documented[strings.ToUpper(method)+" "+path] = true
			}
		}
	}
	slices.Sort(inSandbox)
	if got, want := strings.Join(inSandbox, " "), strings.Join(gateway.SelfPaths(), " "); got != want {
		t.Errorf("api/openapi.yaml documents %s on %s; the gateway serves %s", got, gateway.SelfHost, want)
	}
	s := New(nil, api.VersionInfo{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	routed := map[string]bool{}
	for _, r := range s.routes {
		pattern := strings.ReplaceAll(r.pattern, "...}", "}")
		routed[pattern] = true
		if !documented[pattern] {
			t.Errorf("route %s is not in api/openapi.yaml", pattern)
		}
	}
	for op := range documented {
		if !routed[op] {
			t.Errorf("api/openapi.yaml documents %s, which is not routed", op)
		}
	}
}

// servedAhead are the paths the daemon's listeners serve ahead of this
// router (internal/daemon/mcp.go, internal/console, previews.go).
var servedAhead = []string{"/mcp", "/ui/login", "/ui/ws/terminal/{id}", "/preview/{preview}/{path}"}

// clusterGateway is the server of the paths only a cluster's gateway
// serves.
const clusterGateway = "http://paddock-gateway"

// openAPI is the part of api/openapi.yaml the tests check.
type openAPI struct {
	Paths map[string]struct {
		Servers []struct {
			URL string `yaml:"url"`
		} `yaml:"servers"`
		Ops map[string]any `yaml:",inline"`
	} `yaml:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]any `yaml:"properties"`
		} `yaml:"schemas"`
	} `yaml:"components"`
}

func loadOpenAPI(t *testing.T) openAPI {
	t.Helper()
	b, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	return doc
}

// TestOpenAPISchemas keeps the schemas of api/openapi.yaml true to the
// api types they describe: the same JSON fields, none missing, none extra.
func TestOpenAPISchemas(t *testing.T) {
	doc := loadOpenAPI(t)
	for name, v := range map[string]any{
		"Self":          api.Self{},
		"Denial":        api.Denial{},
		"Sample":        api.Sample{},
		"Metrics":       api.Metrics{},
		"StorageSpace":  api.StorageSpace{},
		"BudgetStatus":  api.BudgetStatus{},
		"BudgetLine":    api.BudgetLine{},
		"Autoscale":     api.Autoscale{},
		"Resources":     api.Resources{},
		"Policy":        api.Policy{},
		"Node":          api.Node{},
		"NodeResources": api.NodeResources{},
		"CreateRequest": api.CreateRequest{},
		"Container":     api.Container{},
		"SharedVolume":  api.SharedVolume{},
	} {
		schema, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("api/openapi.yaml has no schema %s", name)
			continue
		}
		documented := slices.Sorted(maps.Keys(schema.Properties))
		var fields []string
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			f := rt.Field(i)
			if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); f.IsExported() && tag != "-" {
				fields = append(fields, cmp.Or(tag, f.Name))
			}
		}
		slices.Sort(fields)
		if !slices.Equal(documented, fields) {
			t.Errorf("schema %s documents %v; api.%s has %v", name, documented, name, fields)
		}
	}
}
