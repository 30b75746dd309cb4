package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/e2b"
)

func TestE2BKey(t *testing.T) {
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("a-daemon-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	root := newRoot(&out, &errOut)
	root.SetArgs([]string{"e2b-key", "--token-file", tokFile})
	if err := root.Execute(); err != nil {
		t.Fatalf("e2b-key: %v (%s)", err, errOut.String())
	}
	if got, want := strings.TrimSpace(out.String()), e2b.APIKey("a-daemon-token-0123456789"); got != want {
		t.Errorf("e2b-key printed %q, want %q (the key of the trimmed token)", got, want)
	}

	t.Setenv("PADDOCK_TOKEN", "")
	root = newRoot(&out, &errOut)
	root.SetArgs([]string{"e2b-key"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "no token") {
		t.Errorf("e2b-key without a token: %v, want an error saying there is no token", err)
	}
}

func TestCreateOnTimeoutFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want api.TimeoutAction
		err  string
	}{
		{[]string{"--timeout", "10m", "--on-timeout", "pause"}, api.TimeoutPause, ""},
		{[]string{"--timeout", "10m"}, "", ""},
		{[]string{"--timeout", "10m", "--on-timeout", "explode"}, "", "--on-timeout"},
		{[]string{"--on-timeout", "pause"}, "", "needs --timeout"},
	} {
		var f createFlags
		cmd := &cobra.Command{Use: "create"}
		f.register(cmd)
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatal(err)
		}
		req, err := f.request()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: %v, want an error naming %s", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || req.OnTimeout != tc.want || req.TimeoutSeconds != 600 {
			t.Errorf("%v: on_timeout %q timeout %d %v, want %q after 600 s", tc.args, req.OnTimeout, req.TimeoutSeconds, err, tc.want)
		}
	}
}

func TestCreateElasticFlags(t *testing.T) {
	var f createFlags
	cmd := &cobra.Command{Use: "create"}
	f.register(cmd)
	if err := cmd.ParseFlags([]string{"--budget-cpu-seconds", "60", "--budget-action", "kill", "--autoscale-min-memory", "256m", "--autoscale-max-memory", "4g"}); err != nil {
		t.Fatal(err)
	}
	req, err := f.request()
	if err != nil {
		t.Fatal(err)
	}
	if req.Budget == nil || req.Budget.CPUSeconds != 60 || req.Budget.Action != "kill" {
		t.Errorf("budget %+v, want 60 CPU-seconds, kill", req.Budget)
	}
	if req.Autoscale == nil || req.Autoscale.MinMemoryBytes != 256<<20 || req.Autoscale.MaxMemoryBytes != 4<<30 {
		t.Errorf("autoscale %+v, want 256 MiB..4 GiB", req.Autoscale)
	}
	if err := cmd.ParseFlags([]string{"--autoscale-max-memory", "lots"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.request(); err == nil || !strings.Contains(err.Error(), "--autoscale-max-memory") {
		t.Errorf("a bad size: %v, want an error naming --autoscale-max-memory", err)
	}
}
