package cli

import (
	"os"
	"testing"

	"github.com/paddock-dev/paddock/client"
)

func TestParseLocation(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want location
	}{
		{"abc123:/workspace/x", location{id: "abc123", path: "/workspace/x", remote: true}},
		{"abc-1:rel/path", location{id: "abc-1", path: "rel/path", remote: true}},
		{"abc:", location{id: "abc", path: ".", remote: true}},
		{"-", location{stdio: true}},
		{"./a:b", location{path: "./a:b"}},
		{"/tmp/x:y", location{path: "/tmp/x:y"}},
		{"Upper:/x", location{path: "Upper:/x"}},
		{"local", location{path: "local"}},
	} {
		if got := parseLocation(tc.arg); got != tc.want {
			t.Errorf("parseLocation(%q) = %+v, want %+v", tc.arg, got, tc.want)
		}
	}
}

func TestReplaceFirst(t *testing.T) {
	for _, tc := range []struct{ to, in, want string }{
		{"new", "proj", "new"},
		{"new", "proj/a/b", "new/a/b"},
		{"", "proj", ""},
		{"", "proj/a", "a"},
	} {
		if got := replaceFirst(tc.to)(tc.in); got != tc.want {
			t.Errorf("replaceFirst(%q)(%q) = %q, want %q", tc.to, tc.in, got, tc.want)
		}
	}
}

func TestLsMode(t *testing.T) {
	for _, tc := range []struct {
		typ  string
		mode client.FileMode
		want string
	}{
		{client.TypeFile, 0o644, "-rw-r--r--"},
		{client.TypeDir, 0o1777, "drwxrwxrwt"},
		{client.TypeFile, 0o4755, "-rwsr-xr-x"},
		{client.TypeFile, 0o2640, "-rw-r-S---"},
		{client.TypeSymlink, 0o777, "lrwxrwxrwx"},
		{client.TypeOther, 0o600, "?rw-------"},
	} {
		fi := client.FileInfo{Type: tc.typ, Mode: tc.mode}
		if got := lsMode(&fi); got != tc.want {
			t.Errorf("lsMode(%s %o) = %s, want %s", tc.typ, tc.mode, got, tc.want)
		}
	}
}

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want os.FileMode
		ok   bool
	}{
		{"644", 0o644, true},
		{"0755", 0o755, true},
		{"0o700", 0o700, true},
		{"4755", 0o755 | os.ModeSetuid, true},
		{"0", 0, true},
		{"888", 0, false},
		{"17777", 0, false},
		{"rwx", 0, false},
	} {
		got, err := parseMode(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseMode(%q) = %v, %v", tc.in, got, err)
		}
	}
}

// TestHostName: a name the sandbox reports for a file copied into a host
// directory is one element, never a path that leads elsewhere.
func TestHostName(t *testing.T) {
	for _, name := range []string{"", ".", "..", "../x", "a/b", "/etc/passwd", "x\x00y"} {
		if _, err := hostName(name); err == nil {
			t.Errorf("hostName(%q) accepted", name)
		}
	}
	for _, name := range []string{"a", "a.txt", "..a", "a b"} {
		if got, err := hostName(name); err != nil || got != name {
			t.Errorf("hostName(%q) = %q, %v", name, got, err)
		}
	}
}
