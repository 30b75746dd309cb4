package egress

import "time"

// Event is one decision of the proxy (or the resolver), reported when the
// connection or request it decided ends, so that it carries the bytes
// moved. It is the record behind GET /v1/sandboxes/{id}/events; its JSON
// field names are stable:
//
//	{"time":"2025-01-02T15:04:05.123Z","kind":"http","action":"deny",
//	 "host":"api.example.com","ip":"203.0.113.7","port":443,
//	 "method":"GET","path":"/v2/denied","status":403,
//	 "rule":"","reason":"no rule allows GET https://api.example.com/v2/denied",
//	 "suggest":"--allow https://api.example.com/v2/denied",
//	 "intercepted":true,"bytes_out":0,"bytes_in":0,"duration_ms":0.4}
type Event struct {
	Time time.Time `json:"time"`
	Kind Kind      `json:"kind"`
	// Action is "allow" or "deny".
	Action string `json:"action"`
	// Host is the SNI, the HTTP host or the CONNECT host; IP the address
	// connected to (or the original destination when nothing was).
	Host   string `json:"host,omitempty"`
	IP     string `json:"ip,omitempty"`
	Port   uint16 `json:"port,omitempty"`
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	// Status is the HTTP status the sandbox got (403 for a refusal).
	Status  int    `json:"status,omitempty"`
	Rule    string `json:"rule,omitempty"`
	Reason  string `json:"reason"`
	Suggest string `json:"suggest,omitempty"`
	// Intercepted: TLS was terminated by the sandbox's CA.
	Intercepted bool `json:"intercepted,omitempty"`
	// BytesOut went from the sandbox towards the destination; BytesIn came
	// back. For HTTP they count bodies; for connections, all bytes.
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
	// Secrets names the secrets injected into the request.
	Secrets []string `json:"secrets,omitempty"`
	// Exfiltration: the request carried a secret's placeholder outside
	// its scope and was refused.
	Exfiltration bool `json:"exfiltration,omitempty"`
	// Error is what went wrong upstream (dial, TLS verification, reset).
	Error      string  `json:"error,omitempty"`
	DurationMS float64 `json:"duration_ms"`
}

func action(allow bool) string {
	if allow {
		return "allow"
	}
	return "deny"
}
