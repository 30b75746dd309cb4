package egress

import "sort"

// PresetInternet allows every public address (see PublicAddr) and every
// name whose addresses are public.
const PresetInternet = "internet"

// registryPresets are the named sets of package-registry hosts a policy can
// allow by name. This is the one list of them; the rules use the same
// syntax as Policy.Allow.
var registryPresets = map[string][]string{
	"pypi":   {"pypi.org", "files.pythonhosted.org"},
	"npm":    {"registry.npmjs.org"},
	"github": {"github.com", "*.github.com", "*.githubusercontent.com", "codeload.github.com"},
	"golang": {"proxy.golang.org", "sum.golang.org", "*.golang.org"},
	"debian": {"deb.debian.org", "security.debian.org"},
}

// Presets returns the names of every preset with the rules each stands
// for; internet stands for no rule but a class of addresses.
func Presets() map[string][]string {
	m := map[string][]string{PresetInternet: nil}
	for k, v := range registryPresets {
		m[k] = append([]string(nil), v...)
	}
	return m
}

func presetNames() []string {
	names := []string{PresetInternet}
	for k := range registryPresets {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}
