// Package egress owns what leaves a sandbox: the policy (which hosts,
// addresses, ports and HTTP paths a sandbox may reach), the decisions made
// against it and their reasons, the transparent proxy that enforces them
// (TLS by SNI, HTTP by Host and path, other TCP by address and port), TLS
// interception with a per-sandbox CA where a decision needs the request,
// the encrypted secret store and the injection of secrets into requests,
// and the audit events every decision produces.
//
// The DNS resolver (package egress/dns) asks the same Engine about names;
// the network package redirects every TCP connection of a sandbox to the
// proxy's listener.
package egress
