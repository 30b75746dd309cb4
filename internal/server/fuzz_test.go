package server

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// decodeTargets are the request bodies the API decodes, chosen by the
// fuzzer's first argument.
var decodeTargets = []func() any{
	func() any { return new(api.CreateRequest) },
	func() any { return new(api.ExecRequest) },
	func() any { return new(api.Policy) },
	func() any { return new(api.TemplateSpec) },
	func() any { return new(api.UpdateRequest) },
	func() any { return new(api.PortRequest) },
	func() any { return new(api.ForkRequest) },
	func() any { return new(api.VolumeRequest) },
	func() any { return new(api.SecretRequest) },
	func() any { return new(api.PoolRequest) },
	func() any { return new(api.MoveRequest) },
}

// FuzzDecode: a request body, whatever its bytes, is either refused with
// a categorized error (400 or 413, never 500) or decoded into a value
// that, encoded again, decodes to the same value.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		mk := decodeTargets[int(kind)%len(decodeTargets)]
		v := mk()
		err := decode(httptest.NewRecorder(), httptest.NewRequest("POST", "/", bytes.NewReader(body)), v)
		if err != nil {
			if code := errdefs.Code(err); code != "invalid_argument" && code != "too_large" {
				t.Fatalf("refused as %s, want invalid_argument or too_large: %v", code, err)
			}
			return
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("accepted %T that does not encode: %v", v, err)
		}
		again := mk()
		if err := decode(httptest.NewRecorder(), httptest.NewRequest("POST", "/", bytes.NewReader(b)), again); err != nil {
			t.Fatalf("re-encoded %s is refused: %v", b, err)
		}
		if b2, _ := json.Marshal(again); !bytes.Equal(b2, b) {
			t.Fatalf("re-encoded %s decodes to %s", b, b2)
		}
	})
}
