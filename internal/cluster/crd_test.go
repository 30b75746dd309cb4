package cluster

import (
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/paddock-dev/paddock/api"
)

// TestCRDSchemaHasNodeFields: the PaddockNode schema names every field of
// api.Node, and no other: the API server prunes a field the schema lacks,
// so a field added to api.Node but not to the schema would vanish between
// the node and the gateways without an error.
func TestCRDSchemaHasNodeFields(t *testing.T) {
	status := crdSchema(t, "../../deploy/crd-paddocknode.yaml").Properties["status"]
	compare(t, "status", status, reflect.TypeOf(api.Node{}))
	compare(t, "status.capacity", status.Properties["capacity"], reflect.TypeOf(api.NodeResources{}))
	compare(t, "status.allocated", status.Properties["allocated"], reflect.TypeOf(api.NodeResources{}))
}

type openAPISchema struct {
	Properties           map[string]openAPISchema `json:"properties"`
	Items                *openAPISchema           `json:"items"`
	AdditionalProperties *openAPISchema           `json:"additionalProperties"`
}

// crdSchema reads the schema of the one version of the CRD at path.
func crdSchema(t *testing.T, path string) openAPISchema {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema openAPISchema `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	if len(crd.Spec.Versions) != 1 {
		t.Fatalf("%s: %d versions, want 1", path, len(crd.Spec.Versions))
	}
	return crd.Spec.Versions[0].Schema.OpenAPIV3Schema
}

// compare checks that schema s names every field of typ but those in
// except (fields the daemon sets, never declared), and no other.
func compare(t *testing.T, where string, s openAPISchema, typ reflect.Type, except ...string) {
	t.Helper()
	var want, got []string
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if !slices.Contains(except, name) {
			want = append(want, name)
		}
	}
	for k := range s.Properties {
		got = append(got, k)
	}
	sort.Strings(want)
	sort.Strings(got)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("schema of %s has %v; %s has %v", where, got, typ, want)
	}
}
