package mcp

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/paddock-dev/paddock/client"
)

// connect serves cfg in process and returns a session of the SDK's client.
// The daemon socket does not exist: these tests cover what the server
// decides before it calls the daemon.
func connect(t *testing.T, cfg Config) *sdk.ClientSession {
	t.Helper()
	c, err := client.New("unix://" + filepath.Join(t.TempDir(), "none.sock"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client = c
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, ct := sdk.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func toolNames(t *testing.T, cs *sdk.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		if tl.InputSchema == nil || tl.OutputSchema == nil {
			t.Errorf("tool %s lacks an input or output schema", tl.Name)
		}
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

func TestTools(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"all", Config{}, []string{"create", "delete", "denials", "exec", "fork", "list", "list_files", "logs", "pause", "read_file", "requests", "resume", "search_files", "snapshot", "stats", "write_file"}},
		{"policy", Config{AllowPolicyChanges: true}, []string{"create", "delete", "denials", "exec", "fork", "list", "list_files", "logs", "pause", "read_file", "requests", "resume", "search_files", "set_policy", "snapshot", "stats", "write_file"}},
		{"scoped", Config{Sandbox: "sb1"}, []string{"denials", "exec", "list_files", "logs", "pause", "read_file", "requests", "resume", "search_files", "snapshot", "stats", "write_file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := toolNames(t, connect(t, tc.cfg))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("tools = %v, want %v", got, tc.want)
			}
		})
	}
}

// toolError calls a tool and returns its error text; it fails the test if the
// call succeeded or failed as a protocol error instead of a tool error.
func toolError(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error %v, want a tool error", name, err)
	}
	if !res.IsError {
		t.Fatalf("%s(%v) succeeded, want an error", name, args)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestBadInput(t *testing.T) {
	cs := connect(t, Config{})
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"exec", map[string]any{"sandbox": "x"}, "cmd"},
		{"exec", map[string]any{"cmd": []string{"ls"}}, "sandbox: required"},
		{"exec", map[string]any{"sandbox": "x", "cmd": []string{"ls"}, "timeout_seconds": -1}, "timeout_seconds"},
		{"exec", map[string]any{"sandbox": "x", "cmd": "ls"}, "cmd"},
		{"read_file", map[string]any{"sandbox": "x", "path": "etc/passwd"}, "absolute"},
		{"write_file", map[string]any{"sandbox": "x", "path": "/a", "content": "!", "encoding": "base64"}, "base64"},
		{"write_file", map[string]any{"sandbox": "x", "path": "/a", "content": "", "encoding": "rot13"}, "encoding"},
		{"write_file", map[string]any{"sandbox": "x", "path": "/a", "content": "", "mode": "9z"}, "mode"},
		{"list_files", map[string]any{"sandbox": "x", "path": "/", "depth": 99}, "depth"},
		{"search_files", map[string]any{"sandbox": "x"}, "name or content"},
		{"search_files", map[string]any{"sandbox": "x", "path": "rel", "name": "*"}, "absolute"},
		{"search_files", map[string]any{"sandbox": "x", "name": "[a"}, "syntax error"},
		{"search_files", map[string]any{"sandbox": "x", "name": "*", "max_results": 5000}, "max_results"},
		{"search_files", map[string]any{"sandbox": "x", "content": "x", "max_bytes": 1 << 40}, "max_bytes"},
		{"search_files", map[string]any{"sandbox": "x", "name": "*", "depth": 33}, "depth"},
		{"create", map[string]any{"memory_mb": -5}, "negative"},
		{"create", map[string]any{"allow": []string{"example.com"}}, "--allow-policy-changes"},
		{"denials", map[string]any{"sandbox": "x", "limit": 5000}, "limit"},
		{"nosuchtool", nil, "nosuchtool"},
		// Reaches the (absent) daemon: the error names the call.
		{"stats", map[string]any{"sandbox": "x"}, "getting x"},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: tc.tool, Arguments: tc.args})
			var msg string
			switch {
			case err != nil:
				msg = err.Error() // a protocol error (unknown tool)
			case !res.IsError:
				t.Fatalf("%s(%v) succeeded, want an error", tc.tool, tc.args)
			default:
				msg = toolError(t, cs, tc.tool, tc.args)
			}
			if !strings.Contains(msg, tc.want) {
				t.Fatalf("%s(%v): error %q does not name %q", tc.tool, tc.args, msg, tc.want)
			}
		})
	}
	// The server still serves after all that.
	if len(toolNames(t, cs)) == 0 {
		t.Fatal("no tools after bad input")
	}
}

func TestScope(t *testing.T) {
	cs := connect(t, Config{Sandbox: "mine"})
	extra := map[string]map[string]any{
		"exec":         {"cmd": []string{"true"}},
		"read_file":    {"path": "/etc/hostname"},
		"write_file":   {"path": "/tmp/x", "content": "x"},
		"list_files":   {"path": "/"},
		"search_files": {"name": "*"},
	}
	for _, tool := range []string{"exec", "read_file", "write_file", "list_files", "search_files", "snapshot", "pause", "resume", "logs", "stats", "denials", "requests"} {
		args := map[string]any{"sandbox": "other"}
		for k, v := range extra[tool] {
			args[k] = v
		}
		msg := toolError(t, cs, tool, args)
		if !strings.Contains(msg, "outside this server's scope") {
			t.Errorf("%s on another sandbox: %q, want a scope refusal", tool, msg)
		}
	}
	for _, tool := range []string{"create", "delete", "fork", "list", "set_policy"} {
		res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: tool, Arguments: map[string]any{"sandbox": "mine"}})
		if err == nil && !res.IsError {
			t.Errorf("%s is served by a scoped server", tool)
		}
	}
}
