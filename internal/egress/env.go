package egress

// SandboxEnv is the environment that points a sandbox's tools at the
// egress proxy (for those that honour HTTP_PROXY; the rest are redirected
// anyway) and at its CA certificate, installed at caFile inside the
// sandbox (also append it to the system bundle,
// /etc/ssl/certs/ca-certificates.crt, for tools that read only that).
// caFile must be a bundle that holds the public roots too: SSL_CERT_FILE
// and REQUESTS_CA_BUNDLE replace the default roots rather than add to them.
func SandboxEnv(proxyURL, caFile string) map[string]string {
	env := map[string]string{
		"SSL_CERT_FILE":       caFile,
		"NODE_EXTRA_CA_CERTS": caFile,
		"REQUESTS_CA_BUNDLE":  caFile,
		"CURL_CA_BUNDLE":      caFile,
		"GIT_SSL_CAINFO":      caFile,
	}
	if proxyURL != "" {
		for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
			env[k] = proxyURL
		}
		env["NO_PROXY"], env["no_proxy"] = "localhost,127.0.0.1,::1", "localhost,127.0.0.1,::1"
	}
	return env
}
