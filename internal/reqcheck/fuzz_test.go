package reqcheck

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// FuzzLaneRequest: a lane request frame, whatever its bytes, is either
// refused with a categorized error (the daemon answers 400 or 413, never
// 500) or decoded into a request that passes every check, runs in the
// bound sandbox, and decodes again to the same request once re-encoded (as JSON: an
// empty env and an absent one are the same request).
func FuzzLaneRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, payload []byte, bound string) {
		req, err := LaneRequest(payload, bound)
		if err != nil {
			if code := errdefs.Code(err); code != "invalid_argument" && code != "too_large" {
				t.Fatalf("refused as %s, want invalid_argument or too_large: %v", code, err)
			}
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("refused without a message")
			}
			return
		}
		if err := Exec(&req.Exec); err != nil {
			t.Fatalf("accepted a request Exec refuses: %v", err)
		}
		if req.Exec.TTY != nil || bound != "" && req.Sandbox != bound {
			t.Fatalf("accepted %+v on a lane bound to %q", req, bound)
		}
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := LaneRequest(b, bound)
		if err != nil {
			t.Fatalf("re-encoded %s is refused: %v", b, err)
		}
		if b2, _ := json.Marshal(again); string(b2) != string(b) {
			t.Fatalf("re-encoded %s decodes to %s", b, b2)
		}
	})
}
